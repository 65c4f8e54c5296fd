"""EMA and FAWA (CFA Sec. 4.3) on a one-parameter model."""
import torch
from torch import nn

from fastfair.training.averaging import WeightAverage


def model_with(value: float) -> nn.Module:
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    with torch.no_grad():
        m[0].weight.fill_(value)
        m[1].running_mean.fill_(value)
    return m


def weight(avg: WeightAverage) -> float:
    return float(avg.model[0].weight)


def test_fawa_skips_an_epoch_below_the_threshold_and_averages_above_it():
    avg = WeightAverage(model_with(0.0), decay=0.85, begin=0, threshold=0.2)
    assert not avg.update(model_with(1.0), 0, worst_val_robust=0.19)  # below: nothing averaged yet
    assert not avg.started
    assert avg.update(model_with(2.0), 1, worst_val_robust=0.2)  # first accepted epoch: a copy
    assert weight(avg) == 2.0
    assert not avg.update(model_with(100.0), 2, worst_val_robust=0.1)  # unfair epoch: skipped
    assert weight(avg) == 2.0
    assert avg.update(model_with(4.0), 3, worst_val_robust=0.5)
    assert abs(weight(avg) - (0.85 * 2.0 + 0.15 * 4.0)) < 1e-6
    assert abs(float(avg.model[1].running_mean) - 2.3) < 1e-6  # BN statistics are averaged too
    assert int(avg.model[1].num_batches_tracked) == 0  # integer counters are copied


def test_ema_takes_every_epoch_from_begin():
    avg = WeightAverage(model_with(0.0), decay=0.5, begin=2, threshold=None)
    assert not avg.update(model_with(1.0), 1, worst_val_robust=0.0)
    assert avg.update(model_with(1.0), 2, worst_val_robust=0.0)
    assert avg.update(model_with(3.0), 3, worst_val_robust=0.0)
    assert weight(avg) == 2.0


def test_state_dict_round_trip_keeps_the_average_and_whether_it_started():
    avg = WeightAverage(model_with(0.0), decay=0.5, begin=0, threshold=None)
    avg.update(model_with(5.0), 0, 0.0)
    other = WeightAverage(model_with(0.0), decay=0.5, begin=0, threshold=None)
    other.load_state_dict(avg.state_dict())
    assert other.started and weight(other) == 5.0
