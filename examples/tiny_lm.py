"""A model a user would write, trained with ``unbroken run`` (see the README's walk-through).

    unbroken run --trainer examples.tiny_lm:make --trainer-args '{"d_model": 48}' \
        --steps 300 --out out/example

Everything here is ordinary PyTorch: a small causal transformer from ``torch.nn`` building
blocks, a ``Dataset`` class of its own (character windows of a text), AdamW and cross-entropy.
The only unbroken-specific line is the last one: hand the four to ``ModuleTrainer``.

Mapping an existing training loop onto this factory::

    for step, batch in enumerate(loader):        # unbroken owns the loop: any group must be
        loss = loss_fn(*forward(model, batch))   # able to compute any shard of any step, so
        loss.backward(); opt.step()              # batches come from (seed, step, shard type)

    -> model, opt, dataset, loss_fn as below; ``forward`` when a batch is not (x, y);
       the global batch is groups x --shard-size samples; the learning rate schedule is the
       optimizer's (or a factory argument), the data order is the seed's.

Rules the factory must keep (every group and warm spare builds the same trainer): seed every
random choice from ``cfg.seed``, no dropout (or make it a function of the batch), a loss that is
a mean over the batch, and an optimizer whose state can be created eagerly (SGD, Adam, AdamW).
"""

from __future__ import annotations

import codecs
import contextlib
import io

import torch
from torch import nn

from unbroken import ModuleTrainer


def zen_text() -> str:
    """The Zen of Python (rot13-encoded in the stdlib's ``this``): a text every Python has."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints it
        import this as zen
    return codecs.decode(zen.s, "rot13")


class CharWindows(torch.utils.data.Dataset):
    """Every ``seq_len + 1`` character window of a text: (input ids, next-character ids)."""

    def __init__(self, text: str, seq_len: int) -> None:
        self.vocab = sorted(set(text))
        ids = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)
        self.ids, self.seq_len = ids, seq_len

    def __len__(self) -> int:
        return len(self.ids) - self.seq_len - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.ids[i:i + self.seq_len + 1]
        return w[:-1], w[1:]


class TinyLM(nn.Module):
    """Token and position embeddings, ``n_layer`` pre-LN causal encoder layers, a linear head."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_layer: int, n_head: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        h = self.blocks(h, mask=self.mask[:t, :t].to(h.dtype), is_causal=True)
        return self.head(h)


def next_char_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def make(cfg, d_model: int = 32, n_layer: int = 2, n_head: int = 4, seq_len: int = 32,
         lr: float = 3e-3) -> ModuleTrainer:
    """The factory ``unbroken run --trainer examples.tiny_lm:make`` calls in every process:
    ``cfg`` carries the job's seed, groups and shard size; the rest are ``--trainer-args``."""
    data = CharWindows(zen_text(), seq_len)
    torch.manual_seed(cfg.seed)
    model = TinyLM(len(data.vocab), seq_len, d_model, n_layer, n_head).to(torch.float64)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return ModuleTrainer(cfg, model, opt, data, next_char_loss)
