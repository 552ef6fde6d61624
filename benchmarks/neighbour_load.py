"""A synthetic neighbour for contention experiments: load one resource of the machine
until stopped, so that a training run beside it shows what sharing that resource costs.

Modes:
    cpu         PROCS Python processes spinning on the CPU (no GPU): like a rank's main
                thread and loader workers, without their GPU work.
    gpu         large bf16 matrix products on the visible GPU, one host wait every 20:
                the GPU busy, the host almost idle.
    host_bound  small kernels, small host->GPU copies and a GPU->host read after each
                few kernels on the visible GPU: PV-RCNN's pattern (host launches and
                waits, ~60 % GPU busy), without its model.
    launches    host_bound's small kernels only (a read-back every 200 loops keeps the
                launch queue bounded).
    copies      host_bound's small host->GPU copies from pageable memory only.
    reads       host_bound's GPU->host reads only (one tiny kernel and ``.item()``).
                The last three split host_bound's cost into its parts.

    CUDA_VISIBLE_DEVICES=1 python benchmarks/neighbour_load.py host_bound --seconds 300 &
    CUDA_VISIBLE_DEVICES=0 python tools/benchmark_scaling.py CONFIG --nproc 1 ...
    kill %1   # SIGTERM: prints how much work it did

Prints one line at exit: mode, seconds, loop iterations per second.
"""
import argparse
import multiprocessing as mp
import signal
import sys
import time

MODES = ('cpu', 'gpu', 'host_bound', 'launches', 'copies', 'reads')


def _spin(stop_at: float) -> None:
    # a forked child inherits StopFlag's handlers, which only set a flag this loop does
    # not read: back to the default, so that terminate() ends it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    x = 0
    while time.monotonic() < stop_at:
        for _ in range(10000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def _gpu_loop(stop: 'StopFlag', stop_at: float) -> int:
    import torch
    a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
    n = 0
    while not stop.set and time.monotonic() < stop_at:
        for _ in range(20):
            torch.mm(a, b)
        torch.cuda.synchronize()
        n += 1
    return n


def _host_bound_loop(stop: 'StopFlag', stop_at: float) -> int:
    import torch
    x = torch.randn(100_000, device='cuda')
    n = 0
    while not stop.set and time.monotonic() < stop_at:
        y = x
        for _ in range(8):  # a few small kernels, as a point op's index bookkeeping
            y = torch.relu(y * 1.0001 - 0.5)
        idx = torch.tensor([n % 1000, 7, 11], device='cuda')  # small host->GPU copy
        y = y[idx].sum() + (x > 0).sum()
        y.item()  # the host waits for the GPU
        n += 1
    return n


def _part_loop(part: str, stop: 'StopFlag', stop_at: float) -> int:
    """One of host_bound's three kinds of host-GPU traffic alone."""
    import torch
    x = torch.randn(100_000, device='cuda')
    n = 0
    while not stop.set and time.monotonic() < stop_at:
        if part == 'launches':
            y = x
            for _ in range(8):
                y = torch.relu(y * 1.0001 - 0.5)
            if n % 200 == 0:
                torch.cuda.synchronize()
        elif part == 'copies':
            torch.tensor([n % 1000, 7, 11], device='cuda')
        else:  # reads
            (x[:1] + 1).item()
        n += 1
    return n


class StopFlag:
    """Set by SIGTERM / SIGINT so the loop ends and reports."""

    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, *_) -> None:
        self.set = True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('mode', choices=MODES)
    p.add_argument('--seconds', type=float, default=600.0,
                   help='stop after this long at the latest (default 600)')
    p.add_argument('--procs', type=int, default=3,
                   help='cpu mode: spinning processes (default 3: a main thread and '
                        'two loader workers)')
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.procs < 1:
        p.error(f'--seconds must be > 0 and --procs >= 1, got {args.seconds} and '
                f'{args.procs}')
    stop = StopFlag()
    start = time.monotonic()
    stop_at = start + args.seconds
    if args.mode == 'cpu':
        procs = [mp.Process(target=_spin, args=(stop_at,), daemon=True)
                 for _ in range(args.procs)]
        for proc in procs:
            proc.start()
        while not stop.set and time.monotonic() < stop_at:
            time.sleep(0.1)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(timeout=10)
        work = args.procs
    else:
        if args.mode in ('launches', 'copies', 'reads'):
            work = _part_loop(args.mode, stop, stop_at)
        else:
            loop = _gpu_loop if args.mode == 'gpu' else _host_bound_loop
            work = loop(stop, stop_at)
    elapsed = time.monotonic() - start
    rate = f'{work / elapsed:.1f} loops/s' if args.mode != 'cpu' else f'{work} spinners'
    print(f'[neighbour_load] {args.mode}: {elapsed:.1f} s, {rate}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
