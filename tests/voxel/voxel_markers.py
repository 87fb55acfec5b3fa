"""Markers shared by the voxel tests."""

import pytest
import torch

requires_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
