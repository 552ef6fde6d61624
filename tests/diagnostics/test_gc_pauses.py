"""diagnostics/gc_pauses.py: Python's garbage collections in a window, timed and marked."""
import gc

from torch.profiler import ProfilerActivity, profile

from mmdet3d_scaling.diagnostics.gc_pauses import GcPauses, describe


def test_collections_inside_the_window_are_counted_by_generation():
    gc.collect(0)  # before the window: not counted
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    gc.collect(1)  # after: not counted, and the callback is gone
    assert pauses._callback not in gc.callbacks
    gens = [p['generation'] for p in pauses.pauses]
    # automatic collections may come too; the three explicit ones are there
    assert gens.count(2) >= 2 and gens.count(0) >= 1
    fig = pauses.figures(micro_batches=4)
    assert fig['collections'][2] == gens.count(2)
    assert fig['total_ms'] >= fig['longest_ms'] > 0
    assert fig['ms_per_micro_batch'] == fig['total_ms'] / 4
    assert 'gen2 ' in describe(fig) and 'longest' in describe(fig)


def test_a_full_collection_frees_a_reference_cycle_and_says_so():
    with GcPauses() as pauses:
        cycle = []
        cycle.append(cycle)
        del cycle
        gc.collect()
    assert max(p['collected'] for p in pauses.pauses) >= 1
    assert {p['thread'] for p in pauses.pauses} == {'MainThread'}


def test_a_collection_on_another_thread_names_it():
    import threading
    with GcPauses() as pauses:
        worker = threading.Thread(target=gc.collect, name='pin_memory_like')
        worker.start()
        worker.join()
    assert 'pin_memory_like' in {p['thread'] for p in pauses.pauses}


def test_collections_are_ranges_in_a_profile():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with GcPauses(mark_in_profile=True):
            gc.collect(2)
    names = [e.name for e in prof.events()]
    assert 'gc:gen2' in names


def test_an_empty_window():
    with GcPauses() as pauses:
        pass
    fig = pauses.figures(micro_batches=0)
    assert fig['total_ms'] == 0 and fig['longest_ms'] == 0.0 and fig['longest'] == []
