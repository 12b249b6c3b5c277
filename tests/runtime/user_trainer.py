"""A user's own training setup, as a factory importable by every worker process (the test
puts this directory on PYTHONPATH): a float64 two-layer net, AdamW, a TensorDataset, MSE."""

import torch

from unbroken.runtime.module_trainer import ModuleTrainer


def make(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(512, 6, generator=g, dtype=torch.float64)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh() + 0.05 * torch.randn(512, 1, generator=g,
                                                             dtype=torch.float64)
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(),
                                torch.nn.Linear(12, 1)).to(torch.float64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return ModuleTrainer(cfg, model, opt, torch.utils.data.TensorDataset(x, y),
                         torch.nn.functional.mse_loss)
