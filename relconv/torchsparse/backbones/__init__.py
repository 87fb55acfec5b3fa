"""TorchSparse 2.1's `torchsparse.backbones`: SparseResNet21D and SparseResUNet42."""

from relconv.torchsparse.backbones.resnet import SparseResNet, SparseResNet21D
from relconv.torchsparse.backbones.unet import SparseResUNet, SparseResUNet42

__all__ = ["SparseResNet", "SparseResNet21D", "SparseResUNet", "SparseResUNet42"]
