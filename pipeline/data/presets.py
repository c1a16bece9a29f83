"""Image presets: stored pack resolution, network input, normalisation and augmentation per dataset kind.

Values follow the authors' (NC-FSCIL / mmcls) pipelines for the benchmarks:
- cifar100: RandomResizedCrop(32, scale 0.6-1, bicubic), flip, ColorJitter 0.4; test Resize(36) + CenterCrop(32).
- mini_imagenet: RandomResizedCrop(84), flip, ColorJitter 0.4; test Resize(96) + CenterCrop(84); ImageNet stats.
- cub200: RandomResizedCrop(224) of the whole image, flip, ColorJitter 0.3; test Resize(256) + CenterCrop(224)
  of the original; ImageNet stats. The pack keeps each CUB image whole (view "shorter_side"): its shorter side
  resized to test_resize (256), the aspect kept, at the top-left of a canvas of side 2 x test_resize (a longer side
  beyond that is centre-cropped to it) with its extent (h, w); training crops are drawn from the extent and the
  test view is its centre crop.
A preset is defined at its default stored size; asking for another stored size scales the input and
test-resize sizes by the same ratio (CUB stored at 448 -> input 448, test resize 512).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.errors import FSCILError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImagePreset:
    """How images of one dataset kind are stored, augmented for training and transformed for testing."""

    name: str
    image_size: int
    """Stored (pack) resolution: images are image_size x image_size."""
    input_size: int
    """Network input resolution (train crops and test crops are input_size x input_size)."""
    test_resize: int
    """Test transform: resize to test_resize x test_resize, then centre-crop input_size."""
    mean: tuple[float, float, float]
    """Per-channel mean of [0, 1] RGB values, subtracted before the network."""
    std: tuple[float, float, float]
    crop_scale: tuple[float, float]
    """RandomResizedCrop area fraction range."""
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """RandomResizedCrop aspect ratio range."""
    flip_prob: float = 0.5
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    interpolation: str = "bilinear"
    """bilinear or bicubic, for train crops and the test resize."""
    view: str = "square"
    """How the pack stores an image: square (shorter side to image_size, the centre square) or shorter_side (the
    whole image, shorter side at test_resize, aspect kept, on a `canvas` x `canvas` canvas with its extent)."""

    @property
    def canvas(self) -> int:
        """The stored side of a pack image: image_size, or for the shorter_side view 2 x test_resize."""
        return 2 * self.test_resize if self.view == "shorter_side" else self.image_size

    def at_size(self, image_size: int) -> ImagePreset:
        """This preset for packs stored at `image_size`: input and test-resize sizes scaled by the same ratio."""
        if image_size == self.image_size:
            return self
        ratio = image_size / self.image_size
        return replace(self, image_size=image_size, input_size=max(1, round(self.input_size * ratio)),
                       test_resize=max(1, round(self.test_resize * ratio)))


# your own images (root/<class>/<image>): one name for its reader (data.dataset), its image preset and its protocol
CLASS_FOLDER = "class_folder"

PRESETS: dict[str, ImagePreset] = {
    # synthetic: statistics measured on the seed-0 default pack; CIFAR-like augmentation, no test resize
    "synthetic": ImagePreset("synthetic", 32, 32, 32, mean=(0.489, 0.488, 0.489), std=(0.181, 0.181, 0.181),
                             crop_scale=(0.6, 1.0)),
    "cifar100": ImagePreset("cifar100", 32, 32, 36, mean=(129.304 / 255, 124.070 / 255, 112.434 / 255),
                            std=(68.170 / 255, 65.392 / 255, 70.418 / 255), crop_scale=(0.6, 1.0),
                            interpolation="bicubic"),
    "mini_imagenet": ImagePreset("mini_imagenet", 84, 84, 96, IMAGENET_MEAN, IMAGENET_STD, crop_scale=(0.08, 1.0)),
    "cub200": ImagePreset("cub200", 224, 224, 256, IMAGENET_MEAN, IMAGENET_STD, crop_scale=(0.08, 1.0),
                          brightness=0.3, contrast=0.3, saturation=0.3, view="shorter_side"),
    CLASS_FOLDER: ImagePreset(CLASS_FOLDER, 84, 84, 96, IMAGENET_MEAN, IMAGENET_STD, crop_scale=(0.08, 1.0)),
    # omniglot: binary strokes on white, grayscale replicated; statistics measured on background_small1 at 32 px.
    # No flip (a mirrored character can be another one) and no colour jitter; mild crops keep the strokes.
    "omniglot": ImagePreset("omniglot", 32, 32, 32, mean=(0.923, 0.923, 0.923), std=(0.221, 0.221, 0.221),
                            crop_scale=(0.7, 1.0), crop_ratio=(0.8, 1.25), flip_prob=0.0, brightness=0.0,
                            contrast=0.0, saturation=0.0),
}


def get_preset(name: str, image_size: int | None = None) -> ImagePreset:
    """The preset called `name`, for packs stored at `image_size` (None: the preset's default)."""
    preset = PRESETS.get(name)
    if preset is None:
        raise FSCILError(f"unknown image preset {name!r} (known: {', '.join(PRESETS)})")
    return preset if image_size is None else preset.at_size(int(image_size))
