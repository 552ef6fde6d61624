"""``distributed.cpu_affinity='split'``: each rank of a host gets CPUs of its own.

Ranks of one host that share all CPUs slow each other (a host-bound PV-RCNN rank runs
14 % below a lone process; two independent 1-GPU runs at once ~10 %): their main
threads, intra-op threads and loader workers compete on the same cores. With
``'split'``, local rank ``r`` of ``n`` keeps a disjoint, contiguous share of the CPUs the
launcher allowed, set in the main process before the loader workers start (they
inherit it), and at most that many intra-op threads.

The share is computed by :func:`split_cpus` from plain values (allowed CPUs, hyperthread
siblings, NUMA nodes), so every layout can be tested without processes. It prefers, in
this order: whole physical cores inside one NUMA node, whole cores, CPUs inside one
node, any CPUs. A preference is kept only when it costs the smallest share nothing:
DDP ranks run in lockstep, so the smallest share sets the pace, and every layout is
measured against the even split, ``floor(CPUs / ranks)`` CPUs at least.
"""
import glob
import logging
import os
import re
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

MODES = ('split',)
Unit = Tuple[int, ...]  # CPUs that go together (one core's allowed hyperthreads, or one)

# (allowed set the split was computed from, share set on this process); a second runner
# in the same process (tests, notebooks) splits the original set again, not its share
_last_split: Optional[Tuple[FrozenSet[int], FrozenSet[int]]] = None


# ----------------------------------------------------------------- reading the host
def parse_cpu_list(text: str) -> List[int]:
    """Linux CPU list format (``'0-3,8,10-11'``) -> sorted CPU numbers."""
    cpus = set()
    for part in text.strip().split(','):
        if not part:
            continue
        first, _, last = part.partition('-')
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Sorted CPU numbers -> Linux CPU list format (``[0, 1, 2, 5]`` -> ``'0-2,5'``)."""
    ranges: List[List[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ','.join(str(a) if a == b else f'{a}-{b}' for a, b in ranges)


def _read_list(path: str) -> Optional[List[int]]:
    try:
        with open(path) as f:
            return parse_cpu_list(f.read())
    except (OSError, ValueError):
        return None


def read_siblings(cpus: Iterable[int],
                  sys_root: str = '/sys') -> Dict[int, FrozenSet[int]]:
    """CPU -> its hyperthread siblings (itself included), from sysfs; CPUs whose file is
    unreadable are left out (each is then a core of its own)."""
    siblings = {}
    for cpu in cpus:
        found = _read_list(f'{sys_root}/devices/system/cpu/cpu{cpu}/topology/'
                           'thread_siblings_list')
        if found:
            siblings[cpu] = frozenset(found) | {cpu}
    return siblings


def read_numa_nodes(sys_root: str = '/sys') -> Dict[int, FrozenSet[int]]:
    """NUMA node -> its CPUs, from sysfs (empty where the files are unreadable)."""
    nodes = {}
    for path in glob.glob(f'{sys_root}/devices/system/node/node*/cpulist'):
        match = re.search(r'node(\d+)/cpulist$', path)
        found = _read_list(path)
        if match and found:
            nodes[int(match.group(1))] = frozenset(found)
    return nodes


# ----------------------------------------------------------------- computing shares
def _units(allowed: Sequence[int], siblings: Mapping[int, FrozenSet[int]],
           node_of: Mapping[int, int], whole_cores: bool) -> List[Unit]:
    """Allowed CPUs grouped into cores (the core's allowed hyperthreads) or, with
    ``whole_cores=False``, single CPUs still in core order (a core is then split only
    where a cut falls inside it); ordered by NUMA node, then by smallest CPU."""
    cores, seen, allowed_set = [], set(), set(allowed)
    for cpu in allowed:  # sorted
        if cpu not in seen:
            core = tuple(sorted((siblings.get(cpu, frozenset()) | {cpu})
                                & (allowed_set - seen)))
            seen.update(core)
            cores.append(core)
    units = cores if whole_cores else [(cpu,) for core in cores for cpu in core]
    return sorted(units, key=lambda u: node_of.get(u[0], -1))  # stable: core order kept


def _split_balanced(units: Sequence[Unit], parts: int) -> List[List[int]]:
    """``units`` cut into ``parts`` contiguous, non-empty runs of near-equal CPU counts
    (each cut at the unit boundary nearest its ideal position)."""
    sizes = [len(u) for u in units]
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    total, cuts = bounds[-1], [0]
    for j in range(1, parts):
        low, high = cuts[-1] + 1, len(units) - (parts - j)
        target = total * j / parts
        cuts.append(min(range(low, high + 1),
                        key=lambda i: (abs(bounds[i] - target), i)))
    cuts.append(len(units))
    return [sorted(cpu for unit in units[a:b] for cpu in unit)
            for a, b in zip(cuts, cuts[1:])]


def _ranks_per_node(cpus_per_node: Sequence[int], units_per_node: Sequence[int],
                    ranks: int) -> Optional[List[int]]:
    """Ranks per node, one at least each, the rest where most CPUs per rank are left
    (``None`` if the nodes cannot take every rank)."""
    if ranks < len(cpus_per_node):
        return None  # some node without a rank: its CPUs would be left unused
    counts = [1] * len(cpus_per_node)
    for _ in range(ranks - len(counts)):
        open_nodes = [i for i, c in enumerate(counts) if c < units_per_node[i]]
        if not open_nodes:
            return None
        best = max(open_nodes, key=lambda i: (cpus_per_node[i] / counts[i], -i))
        counts[best] += 1
    return counts


def _layout(units: List[Unit], node_of: Mapping[int, int], ranks: int,
            by_node: bool) -> Optional[List[List[int]]]:
    if len(units) < ranks:
        return None
    if not by_node:
        return _split_balanced(units, ranks)
    nodes: Dict[int, List[Unit]] = {}
    for unit in units:
        nodes.setdefault(node_of.get(unit[0], -1), []).append(unit)
    groups = [nodes[n] for n in sorted(nodes)]
    counts = _ranks_per_node([sum(len(u) for u in g) for g in groups],
                             [len(g) for g in groups], ranks)
    if counts is None:
        return None
    return [share for group, count in zip(groups, counts)
            for share in _split_balanced(group, count)]


def split_cpus(allowed: Iterable[int], siblings: Optional[Mapping[int, FrozenSet[int]]],
               numa_nodes: Optional[Mapping[int, Iterable[int]]], local_rank: int,
               local_world_size: int) -> List[int]:
    """The CPUs of ``local_rank`` when ``local_world_size`` ranks split ``allowed``.

    Args:
        allowed (iterable of int): CPUs the launcher allowed (``os.sched_getaffinity``).
        siblings (mapping or None): CPU -> its hyperthread siblings (itself included);
            ``None`` or empty: every CPU a core of its own.
        numa_nodes (mapping or None): NUMA node -> its CPUs; ``None``, empty or one
            node: no NUMA preference.
        local_rank (int): this process's rank on the host, ``0 <= local_rank < n``.
        local_world_size (int): ranks on the host (``n``).

    Returns:
        list[int]: sorted CPUs; the shares of all local ranks are disjoint, contiguous
        in (node, core) order and together are ``allowed``.

    Raises:
        ValueError: fewer allowed CPUs than local ranks, or a rank out of range.
    """
    cpus = sorted(set(allowed))
    ranks = local_world_size
    if not 0 <= local_rank < ranks:
        raise ValueError(f'local rank {local_rank} is outside 0..{ranks - 1} '
                         f'(LOCAL_RANK / LOCAL_WORLD_SIZE)')
    if len(cpus) < ranks:
        raise ValueError(
            f"distributed.cpu_affinity='split' needs at least one CPU per local rank: "
            f'{len(cpus)} CPU(s) allowed ({format_cpu_list(cpus) or "none"}) for '
            f'{ranks} local ranks. Start fewer ranks on this host, allow the process '
            "more CPUs (taskset / the job's CPU request), or set "
            'distributed.cpu_affinity=None.')
    siblings = siblings or {}
    node_of = {cpu: node for node, members in (numa_nodes or {}).items()
               for cpu in members}
    several_nodes = len({node_of.get(cpu, -1) for cpu in cpus}) > 1
    fair = len(cpus) // ranks  # the smallest share of an even split
    for whole_cores in (True, False):
        for by_node in ((True, False) if several_nodes else (False,)):
            shares = _layout(_units(cpus, siblings, node_of, whole_cores), node_of,
                             ranks, by_node)
            if shares is not None and min(len(s) for s in shares) >= fair:
                return shares[local_rank]
    raise AssertionError('unreachable: single CPUs always split evenly')


def describe_share(share: Sequence[int],
                   numa_nodes: Optional[Mapping[int, Iterable[int]]]) -> str:
    """``'0-7 (8 CPUs, NUMA node 0)'``."""
    text = f'{format_cpu_list(share)} ({len(share)} CPU{"s" if len(share) != 1 else ""}'
    nodes = sorted(n for n, members in (numa_nodes or {}).items()
                   if set(share) & set(members))
    if nodes:
        text += f', NUMA node{"s" if len(nodes) > 1 else ""} {format_cpu_list(nodes)}'
    return text + ')'


# ----------------------------------------------------------------- applying
def apply_cpu_affinity(options: Mapping, logger: Optional[object] = 'current',
                       environ: Optional[Mapping[str, str]] = None,
                       sys_root: str = '/sys') -> Optional[List[int]]:
    """Pin this process to its share of the host's CPUs if the config asks for it.

    Call in the main process before loader workers start (forked or spawned workers
    inherit the affinity).

    Args:
        options (mapping): the config's ``distributed`` dict; acts only on
            ``cpu_affinity='split'``.
        logger: where the one line per rank goes (``print_log``'s ``logger``).
        environ (mapping, optional): launcher variables; default ``os.environ``
            (``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, set by torchrun).
        sys_root (str): sysfs root for the CPU topology. Default ``'/sys'``.

    Returns:
        list[int] or None: the CPUs now allowed, or None where nothing was changed.
    """
    global _last_split
    mode = (options or {}).get('cpu_affinity')
    if mode not in MODES:  # None; other values were refused by config validation
        return None
    environ = os.environ if environ is None else environ
    prefix = f"distributed.cpu_affinity={mode!r}"
    if not hasattr(os, 'sched_setaffinity'):
        print_log(f'{prefix}: this platform has no os.sched_setaffinity (Linux only), so '
                  'the CPUs are left as they are.', logger=logger, level=logging.WARNING)
        return None
    try:
        local_rank = int(environ['LOCAL_RANK'])
        local_world = int(environ['LOCAL_WORLD_SIZE'])
    except (KeyError, ValueError):
        print_log(f'{prefix}: no LOCAL_RANK / LOCAL_WORLD_SIZE in the environment (set '
                  'by torchrun), so the CPUs are left as they are.', logger=logger)
        return None
    if local_world <= 1:
        print_log(f'{prefix}: one rank on this host (LOCAL_WORLD_SIZE={local_world}), '
                  'nothing to split; the CPUs are left as they are.', logger=logger)
        return None
    current = frozenset(os.sched_getaffinity(0))
    allowed = (_last_split[0] if _last_split is not None and current == _last_split[1]
               else current)
    numa, siblings = read_numa_nodes(sys_root), read_siblings(allowed, sys_root)
    share = split_cpus(allowed, siblings, numa, local_rank, local_world)
    os.sched_setaffinity(0, share)
    _last_split = (allowed, frozenset(share))
    threads = min(torch.get_num_threads(), len(share))
    torch.set_num_threads(threads)
    # mmengine shows only rank 0's log on the console: it names the whole layout (every
    # rank computes its own share the same way from the set torchrun gave them all)
    layout = ' | '.join(
        format_cpu_list(split_cpus(allowed, siblings, numa, r, local_world))
        for r in range(local_world))
    print_log(f'{prefix}: local rank {local_rank} of {local_world} -> CPUs '
              f'{describe_share(share, numa)}; {threads} intra-op thread(s); local ranks '
              f'0-{local_world - 1}: {layout}', logger=logger)
    return share
