"""Datasets, the FSCIL protocol and the image pack.

- protocol.py: `Session`, `FSCILProtocol` (session-ordered, contiguous class ids).
- pack.py: the HDF5 image pack (`write_pack`, `ImagePack`), the contract every later stage reads.
- readers, one per format: cifar100.py, mini_imagenet.py, cub200.py, class_folder.py -> `SourceDataset` (source.py).
- cec_splits.py: the CEC index lists; sampling.py: seeded protocols for datasets without official splits.
- assemble.py: source + sessions -> relabelled pack content; synthetic.py: the embedded default benchmark.
- presets.py, augment.py, mixing.py: per-dataset image settings, batched GPU-friendly transforms, Mixup/CutMix.
- prepare.py (`build_pack`, from a `DataConfig` of pipeline/config/data_section.py): what the prepare stage calls.
"""
