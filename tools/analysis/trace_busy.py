#!/usr/bin/env python
"""GPU busy share, idle ms by stage and the longest gaps of a saved train-step trace.

    python tools/analysis/trace_busy.py docs/data/same_call/bevfusion_1xb4_spconv_trace_trimmed_h2.json.gz

The trace is ``tools/analysis/benchmark_train_step.py --trace FILE``'s (see
:mod:`mmdet3d_scaling.diagnostics.trace_busy`); ``--out`` writes the figures as JSON,
``--trim FILE.json.gz`` the trace with only what the figures need (a tenth of the size,
the same figures: what docs/data keeps).
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdet3d_scaling.diagnostics.trace_busy import (load_trace, save_trace,  # noqa: E402
                                                    trace_busy, trimmed)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('trace', help='Chrome trace (.json or .json.gz)')
    p.add_argument('--gaps', type=int, default=10, help='longest gaps listed')
    p.add_argument('--out', default=None, help='JSON file for the figures')
    p.add_argument('--trim', default=None,
                   help='write the trace with only the events the figures need here')
    args = p.parse_args(argv)
    events = load_trace(args.trace)
    fig = trace_busy(events, gaps=args.gaps)
    if args.trim:
        save_trace(trimmed(events), args.trim)
    print(f"{fig['steps']} steps, {fig['wall_ms_per_step']:.1f} ms a step, GPU busy "
          f"{fig['busy_ms_per_step']:.1f} ms = {fig['gpu_busy_share']:.1%}")
    print('idle ms a step by stage:')
    for stage, ms in fig['idle_ms_per_step'].items():
        print(f'  {stage:30s} {ms:6.1f}')
    print('longest gaps (ms, ms after the first step started, stage, ms of it in '
          "Python's garbage collection where the trace marks it):")
    for gap in fig['longest_gaps']:
        print(f"  {gap['ms']:6.2f} {gap['at_ms']:8.1f}  {gap['stage']:30s} "
              f"{gap['gc_ms']:6.2f}")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(trace=args.trace, **fig), f, indent=1)


if __name__ == '__main__':
    main()
