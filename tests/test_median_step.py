"""The defaults time an odd number of steps wherever a law's split reads the median step's
timeline: with an even count the p50 lies between two steps and the timeline is one of them
(the lower), so the split describes another step than the one the law measures."""

import ast

import pytest

from labkit.book.notebooks import NOTEBOOK_DIR, inspect_parameters
from labkit.machine.formulas import median, median_index
from labkit.moe.config import MoEConfig
from labkit.perfmodel.modelcheck import LIVE_PIPELINE


def _default(notebook: str, name: str):
    return ast.literal_eval(inspect_parameters(NOTEBOOK_DIR / notebook)[name]["default"])


def test_an_even_count_has_no_median_step():
    times = [0.004, 0.006, 0.0062, 0.0035]
    assert median(times) not in times  # the p50 of four lies between two of them
    assert times[median_index(times)] == 0.004  # the timeline read is the lower one's
    assert median(times[:3]) == times[median_index(times[:3])]


@pytest.mark.parametrize("notebook", ["05_ddp.ipynb", "09_splitting_the_model.ipynb"])
def test_notebooks_time_an_odd_number_of_steps(notebook):
    assert (_default(notebook, "steps") - _default(notebook, "warmup")) % 2 == 1


def test_pipeline_notebook_times_an_odd_number_of_steps():
    assert _default("07_pipeline_bubbles.ipynb", "steps") % 2 == 1  # timed, after its warm-up
    assert LIVE_PIPELINE["steps"] % 2 == 1


def test_moe_times_an_odd_number_of_steps():
    assert MoEConfig().measured_steps % 2 == 1


def test_ddp_warms_up_past_the_bucket_rebuild():
    """DDP rebuilds its gradient buckets in its second step: notebook 05 leaves it untimed."""
    assert _default("05_ddp.ipynb", "warmup") >= 2
