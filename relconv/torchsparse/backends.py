"""TorchSparse's `torchsparse.backends` switches, accepted for code that sets them.

relconv does not read them: its fp32 convs follow torch's own TF32 switch
(`torch.backends.cuda.matmul.allow_tf32`), it picks dataflows without benchmarking, and its hash
tables size themselves.
"""

benchmark = False
allow_tf32 = False
allow_fp16 = True
hash_rsv_ratio = 2


def init() -> None:
    """TorchSparse initialises these from the GPU; here they keep their values."""
