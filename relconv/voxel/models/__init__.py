"""Voxel networks built from relconv.voxel layers."""

from relconv.voxel.models.minkunet import MinkUNet
from relconv.voxel.models.resnet import ResNet

__all__ = ["MinkUNet", "ResNet"]
