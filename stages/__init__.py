"""Stage commands: each reads its params sections and input paths, calls one library function, writes its outputs."""
