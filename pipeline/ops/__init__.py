# params `scan`: which selective scan CUDA tensors take (pipeline.ops.selective_scan.set_scan); here, free of torch,
# so that the config can check the value without importing the kernels
SCAN_CHOICES = ("auto", "torch", "triton", "mamba")
