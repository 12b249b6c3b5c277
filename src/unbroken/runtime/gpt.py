"""A small byte-level GPT on the Python standard library's own sources (``cfg.model == "gpt"``).

Why this model
--------------
The MLP :class:`~unbroken.runtime.mlp.MLPTrainer` is too small for step-time overheads to mean
anything. This is a realistic (if tiny) language model that still satisfies what the stacked step
needs from a :class:`~unbroken.runtime.trainer.TrainerLike`:

* **Real text without a download.** The corpus is the ``*.py`` sources of the running
  interpreter's standard library (``sysconfig.get_paths()["stdlib"]``, test directories and
  site-packages skipped, paths sorted, concatenated up to :data:`CORPUS_BYTES`), present on
  every machine that runs Python. Byte-level tokens (vocab 256): no tokenizer either. Every
  process on one machine reads the same bytes; cached once per process.
* **A pure function of (seed, step, type).** Sample ``i`` is the ``seq_len + 1`` bytes at offset
  ``i * stride`` (windows spread evenly over the corpus); which samples a shard type holds comes
  from :class:`~unbroken.core.shards.DataPlan` exactly as for the MLP, so any group can compute
  any shard's gradient from the parameters alone.
* **float64.** Masking a dead group sums the same per-type gradients in a different order; the
  demo's bar is that 200 faulty steps end within 1e-5 of a failure-free run. In float64 the
  reordering error (~1e-16 relative) stays far below that after AdamW's normalisation and 200
  steps of amplification; float32 (~1e-7) would not leave that margin.

Hyperparameters are :class:`GPTTrainer`'s keyword arguments (``TrainConfig.trainer_args``,
``--trainer-args``), as for any trainer factory. Recommended learning rate: ``lr=3e-3``
(:data:`RECOMMENDED_LR`; AdamW, betas (0.9, 0.95), weight decay 0.1 on the 2-D weights only),
which the job spec passes for ``--trainer gpt``; the keyword's default, 0.05 (the MLP's), is far
too high here.
"""

from __future__ import annotations

import functools
import math
import os
import sysconfig

import torch
import torch.nn.functional as F

from unbroken.core.shards import DataPlan
from unbroken.runtime.config import TrainConfig
from unbroken.runtime.trainer import ParamTrainer

__all__ = ["CORPUS_BYTES", "VOCAB", "RECOMMENDED_LR", "stdlib_corpus", "GPT", "GPTTrainer"]

CORPUS_BYTES = 2_000_000
VOCAB = 256
RECOMMENDED_LR = 3e-3
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@functools.lru_cache(maxsize=None)
def stdlib_corpus(limit: int = CORPUS_BYTES) -> bytes:
    """The first ``limit`` bytes of the stdlib's ``*.py`` files, in sorted relative-path order.

    Deterministic for a given interpreter installation; cached per process.
    """
    root = sysconfig.get_paths()["stdlib"]
    rels = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS]
        for f in files:
            if f.endswith(".py") and not f.startswith("test_"):
                rels.append(os.path.relpath(os.path.join(d, f), root))
    parts, n = [], 0
    for rel in sorted(rels):
        try:
            with open(os.path.join(root, rel), "rb") as fh:
                b = fh.read()
        except OSError:
            continue  # unreadable file: skip (same on every process of this machine)
        parts.append(b)
        n += len(b)
        if n >= limit:
            break
    data = b"".join(parts)[:limit]
    if not data:
        raise ValueError(f"no Python source files found under the stdlib directory {root!r}; "
                         f"the gpt model needs them as its training corpus")
    return data


@functools.lru_cache(maxsize=None)
def _corpus_tensor(limit: int = CORPUS_BYTES) -> torch.Tensor:
    return torch.frombuffer(bytearray(stdlib_corpus(limit)), dtype=torch.uint8)


class Block(torch.nn.Module):
    """Pre-LN transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.fc_out = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, seq_len: int, d: int, n_layer: int, n_head: int) -> None:
        super().__init__()
        if d % n_head:
            raise ValueError(f"d_model {d} is not divisible by n_head {n_head}")
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(seq_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, VOCAB, bias=False)
        # GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight",
                                                                      "fc_out.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class GPTTrainer(ParamTrainer):
    """Byte-level float64 GPT + AdamW, a :class:`~unbroken.runtime.trainer.TrainerLike`.

    Every group builds an identical one from the config and the same keyword arguments (the
    model's hyperparameters; ``dataset_size``: how many corpus windows the data plan draws
    from); ``grad(step, t)`` (mean next-byte cross-entropy over the shard's
    ``shard_size x seq_len`` tokens) depends only on the parameters and (seed, step, t).
    """

    def __init__(self, cfg: TrainConfig, *, seq_len: int = 64, d_model: int = 64,
                 n_layer: int = 2, n_head: int = 4, lr: float = 0.05,
                 dataset_size: int = 256) -> None:
        self.cfg = cfg
        self.seq_len = seq_len
        self.data = DataPlan(dataset_size, cfg.groups, cfg.shard_size, cfg.seed)
        self.corpus = _corpus_tensor()
        span = seq_len + 1
        room = self.corpus.numel() - span
        if room < 0 or room < dataset_size - 1:
            raise ValueError(f"corpus of {self.corpus.numel()} bytes cannot hold "
                             f"{dataset_size} distinct windows of {span} bytes")
        stride = room // max(1, dataset_size - 1)
        self.offsets = torch.arange(dataset_size, dtype=torch.int64) * stride
        self.span = torch.arange(span, dtype=torch.int64)
        torch.manual_seed(cfg.seed)
        self.device = torch.device(cfg.device)
        self.model = GPT(seq_len, d_model, n_layer, n_head).to(torch.float64)
        self.model.to(self.device)  # the device is configuration (cuda: NCCL), chosen at start
        self.params = list(self.model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]  # biases, LayerNorm gains
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=(0.9, 0.95), eps=1e-8)
        self.last_loss: dict[int, float] = {}

    @torch.no_grad()
    def eval_loss(self, windows: int = 64) -> float:
        """Mean next-byte cross-entropy of the current parameters on ``windows`` fixed
        windows that start halfway between training windows (mostly unseen text): a loss
        that does not depend on which samples a sync mode trained on when, so modes that
        reorder or defer samples compare with ``sync`` on it."""
        half = int(self.offsets[1] - self.offsets[0]) // 2 if self.offsets.numel() > 1 else 0
        pick = torch.linspace(0, self.offsets.numel() - 1, windows).round().long()
        starts = (self.offsets[pick] + half).clamp(max=self.corpus.numel() - self.span.numel())
        w = self.corpus[starts[:, None] + self.span].long().to(self.device)
        logits = self.model(w[:, :-1])
        return float(F.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1)))

    def batch(self, step: int, shard_type: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of shard type ``shard_type`` at ``step``: int64 (shard, seq_len)."""
        idx = torch.tensor(self.data.shard(step, shard_type), dtype=torch.int64)
        w = self.corpus[self.offsets[idx][:, None] + self.span].long().to(self.device)
        return w[:, :-1], w[:, 1:]

    def loss(self, step: int, shard_type: int, part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """Mean next-byte cross-entropy over part ``part[0]`` of ``part[1]`` equal parts of
        the shard's windows (a rank's share under FSDP; the whole shard by default). No
        tensor-parallel plan: the attention's fused qkv projection does not split by heads."""
        x, y = self.batch(step, shard_type)
        k, n = part
        size = x.shape[0] // n
        x, y = x[k * size:(k + 1) * size], y[k * size:(k + 1) * size]
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def grad(self, step: int, shard_type: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._flat_grad(self.loss(step, shard_type), shard_type, out)
