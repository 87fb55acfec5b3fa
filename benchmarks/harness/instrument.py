"""Host synchronisations and kernel launches of one call, from torch.profiler.

A whole network that waits on the host shows it here before it shows in a time: every
`.item()`, `.tolist()` or sizing step costs a stream synchronisation, and every small torch op a
launch. Counted over one call of the timed function (after warm-up, so autotuners are done):
- kernel_launches: GPU kernels that ran (CUPTI kernel activity; counts launches made through the
  runtime or the driver API alike, which matters for spconv's cumm kernels);
- host_syncs: CUDA runtime calls that block the host until the device catches up (stream, device
  and event synchronisation, and synchronous memcpy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SYNC_CALLS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D"}
)


def count_syncs_and_launches(fn: Callable[[object], object], inp: object, device: torch.device) -> dict:
    """{"host_syncs": int, "kernel_launches": int} of `fn(inp)`; None values off CUDA."""
    if device.type != "cuda":
        return {"host_syncs": None, "kernel_launches": None}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(inp)
        torch.cuda.synchronize(device)  # outside the count: the profiler's own end-of-call sync
    syncs = launches = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            if not ev.name.startswith(("Memcpy", "Memset")):
                launches += 1
        elif ev.name in SYNC_CALLS:
            syncs += 1
    # The explicit synchronize after the call is one cudaDeviceSynchronize of ours, not the call's.
    return {"host_syncs": max(0, syncs - 1), "kernel_launches": launches}
