"""The saved-activation meter (labkit.memory): exact bytes against hand counts, each storage
once, parameters left out, live bytes back to 0 after backward, the peak."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from labkit.memory import SavedActivations, device_peak_bytes, reset_device_peak  # noqa: E402

B, D_IN, D_HID, D_OUT = 4, 3, 5, 2
F32 = 4


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.Tanh(),
                               torch.nn.Linear(D_HID, D_OUT))


def test_linear_tanh_linear_saves_what_a_hand_count_says():
    """Linear 1 saves its input x, tanh its output h, Linear 2 its input h (the same tensor,
    once) and its weight (to pass a gradient back to h): without parameters, x and h."""
    model, x = _model(), torch.randn(B, D_IN)
    with SavedActivations(exclude=model.parameters()) as meter:
        loss = model(x).sum()
    assert meter.live_bytes == meter.peak_bytes == meter.saved_bytes == F32 * B * (D_IN + D_HID)
    loss.backward()
    assert meter.live_bytes == 0 and meter.peak_bytes == F32 * B * (D_IN + D_HID)


def test_parameters_count_unless_excluded():
    """The same model with nothing excluded: Linear 2's weight (D_OUT x D_HID, saved as a
    transposed view: its whole storage) counts too."""
    model, x = _model(), torch.randn(B, D_IN)
    with SavedActivations() as meter:
        loss = model(x).sum()
    assert meter.live_bytes == F32 * (B * (D_IN + D_HID) + D_OUT * D_HID)
    loss.backward()
    assert meter.live_bytes == 0


def test_a_tensor_saved_twice_counts_once():
    """a * a saves a as both operands; a view saved beside its base shares its storage."""
    a = torch.randn(6, 7, requires_grad=True)
    with SavedActivations() as meter:
        y = a * a
    assert meter.live_bytes == F32 * 6 * 7
    with SavedActivations() as both:
        z = (a * a[0]).sum()  # saves a and a[0], a view of a's storage
    assert both.live_bytes == F32 * 6 * 7
    (y.sum() + z).backward()
    assert meter.live_bytes == both.live_bytes == 0


def test_peak_follows_a_1f1b_like_order_and_marks():
    """Forward two microbatches, backward the first, forward a third: at most two alive; a
    storage freed and saved anew counts again in saved_bytes."""
    ticks = iter(range(100))
    lin = torch.nn.Linear(8, 8)
    one = F32 * 4 * 8  # a microbatch's input, saved by the Linear
    with SavedActivations(exclude=lin.parameters(), clock=lambda: float(next(ticks))) as meter:
        outs = [lin(torch.randn(4, 8)).sum() for _ in range(2)]
        meter.mark("two forwards")
        outs.pop(0).backward()
        meter.mark("one backward")
        meter.reset_peak()
        assert meter.peak_bytes == one
        outs.append(lin(torch.randn(4, 8)).sum())
    assert meter.events == [("two forwards", 0.0, 2 * one), ("one backward", 1.0, one)]
    assert meter.live_bytes == meter.peak_bytes == 2 * one and meter.saved_bytes == 3 * one
    for out in outs:
        out.backward()
    assert meter.live_bytes == 0


def test_only_what_is_saved_while_open_counts():
    lin = torch.nn.Linear(3, 3)
    with SavedActivations(exclude=lin.parameters()) as meter:
        pass
    out = lin(torch.randn(2, 3)).sum()  # after the meter closed
    assert meter.saved_bytes == meter.live_bytes == 0
    out.backward()
    with torch.no_grad(), SavedActivations() as meter:
        lin(torch.randn(2, 3))
    assert meter.saved_bytes == 0  # nothing is saved without a graph


def test_device_peak_is_none_on_a_cpu():
    reset_device_peak(torch.device("cpu"))
    assert device_peak_bytes(torch.device("cpu")) is None
