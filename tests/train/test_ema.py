import torch
from composer.algorithms.ema.ema import EMAParameters, compute_ema

from train.ema import fused_ema_update


def test_fused_update_matches_composers_ema():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    ours, theirs = EMAParameters(model), EMAParameters(model)
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model[1].running_mean.add_(1.0)
        fused_ema_update(model, ours, smoothing=0.9)
        compute_ema(model, theirs, smoothing=0.9)
    for name, value in theirs.named_parameters_dict.items():
        assert torch.allclose(ours.named_parameters_dict[name], value, atol=1e-6), name
    assert torch.allclose(ours.named_buffers_dict["1.running_mean"], theirs.named_buffers_dict["1.running_mean"], atol=1e-6)
    # integer buffers are left alone instead of being averaged through floats
    assert torch.equal(ours.named_buffers_dict["1.num_batches_tracked"], torch.tensor(0))
    assert not torch.equal(ours.named_parameters_dict["0.weight"], model[0].weight)  # it averages, not copies
