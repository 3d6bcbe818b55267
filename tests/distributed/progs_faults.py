"""A rank that fails (run by test_faults.py): `python progs_faults.py MODE` under
`CPU_NUM_DEVICES=N`. MODE `raise`: rank 1 raises after one step with collectives; `exit`: rank 1
dies without a Python exception (`os._exit(3)`) while the others wait in a collective; `wait OUT`:
each process writes its pid to OUT and sleeps (the test interrupts the launcher)."""

import os
import sys
import time

import torch
import torch_xla
import torch_xla.core.xla_model as xm


class StepError(ValueError):
    pass


def _mp_fn(index, mode, out_dir=None):
    if mode == "wait":  # for Ctrl-C: say we are up, then wait
        with open(os.path.join(out_dir, f"pid{index}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    dev = torch_xla.device()
    t = torch.ones(4, device=dev) * (index + 2)
    xm.all_reduce(xm.REDUCE_SUM, t)
    xm.mark_step()
    if index == 1:
        if mode == "raise":
            raise StepError(f"bad batch on rank {index}")
        os._exit(3)
    for _ in range(1000):  # the others go on and block in the next collective
        t = xm.all_reduce(xm.REDUCE_SUM, t)
        xm.mark_step()


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=tuple(sys.argv[1:]))
