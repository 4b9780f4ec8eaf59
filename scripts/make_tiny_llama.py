"""Make the tiny Llama that ships with pd-train, and the synthetic corpus it was trained on.

The corpus is a small made-up language with structure a 4-layer model can learn and a
decomposition can find: documents of sentences from a grammar with

  * topics: each document picks one of 8 topics, which skews its choice of nouns and verbs
    (context a model must carry across sentences);
  * number agreement: a verb takes the singular or plural form of its subject's head noun, also
    across an intervening prepositional phrase ("the red dogs near a cat run .");
  * recursion: "X says that S" embeds a sentence;
  * repetition: some sentences are announced with "again :" and repeat the sentence just
    before them word for word (a copy task, solvable with induction heads).

Tokens are uint16, vocabulary 384 (``vocab.json`` maps ids to words; id 0 is ``<bos>``, which
starts every document). The model is a ``LlamaForCausalLM`` (4 layers, hidden 64, 4 heads over 2
kv heads, MLP 256, untied embeddings, Llama-3 RoPE scaling) trained with AdamW for a few minutes
on one CPU thread, saved in Hugging Face layout (fp32 safetensors). With the defaults (1500 steps
of 16 x 128 tokens, about 8 minutes on a shared machine) it reaches a held-out loss of 2.79 nats
(unigram entropy 4.90, uniform 5.95) and gives the verb's correct number more probability than
the wrong one 99.6% of the time, but has not yet learned the copy task (21% top-1 on repeated
words, no better than elsewhere): induction takes longer than this budget.

Outputs, under packages/pd-train/src/pd_train/assets/:
  tiny_llama/{config.json, model.safetensors, vocab.json}
  tiny_corpus.npy       training tokens [N]
  tiny_corpus_val.npy   held-out tokens from fresh documents

Needs torch and transformers, which pd never depends on; run it in a separate venv::

    uv venv /work/hfvenv -p 3.11
    uv pip install -p /work/hfvenv/bin/python /opt/wheels/torch-*.whl transformers safetensors numpy
    /work/hfvenv/bin/python scripts/make_tiny_llama.py
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "packages" / "pd-train" / "src" / "pd_train" / "assets"
VOCAB_SIZE = 384
N_TOPICS = 8

# Per-token tags, used only to report what the trained model predicts well (never shipped).
TAG_OTHER, TAG_VERB, TAG_COPY = 0, 1, 2


class Language:
    """The vocabulary and the grammar's sampler."""

    def __init__(self, rng: np.random.Generator) -> None:
        words: list[str] = ["<bos>", ".", ",", "and", "that", "says", "say", "again", ":"]
        self.special = {w: i for i, w in enumerate(words)}

        def add(names: list[str]) -> np.ndarray:
            start = len(words)
            words.extend(names)
            return np.arange(start, start + len(names))

        self.det_sing = add(["a", "the", "this", "every"])
        self.det_plur = add(["some", "these", "many", "all"])
        nouns = [f"n{i}" for i in range(100)]
        self.noun_sing = add(nouns)
        self.noun_plur = add([f"{n}s" for n in nouns])
        trans = [f"v{i}" for i in range(26)]
        intrans = [f"u{i}" for i in range(14)]
        self.trans_sing = add([f"{v}s" for v in trans])
        self.trans_plur = add(trans)
        self.intrans_sing = add([f"{v}s" for v in intrans])
        self.intrans_plur = add(intrans)
        self.adj = add([f"adj{i}" for i in range(40)])
        self.prep = add(["near", "under", "with", "behind", "above", "for", "from", "beside"])
        self.names = add([f"Name{i}" for i in range(20)])
        assert len(words) <= VOCAB_SIZE, len(words)
        words.extend(f"<unused{i}>" for i in range(VOCAB_SIZE - len(words)))
        self.words = words

        # Topics: a Zipfian preference over a random order of nouns and of verbs.
        def zipf_over(n: int) -> np.ndarray:
            p = 1.0 / np.arange(1, n + 1) ** 1.1
            probs = np.zeros((N_TOPICS, n))
            for t in range(N_TOPICS):
                probs[t, rng.permutation(n)] = p / p.sum()
            return probs

        self.noun_p = zipf_over(100)
        self.trans_p = zipf_over(26)
        self.intrans_p = zipf_over(14)
        self.adj_p = zipf_over(40)

    def noun_phrase(self, rng, topic: int, out: list[int], depth: int) -> bool:
        """Append an NP; return whether its head is plural."""
        if rng.random() < 0.12:
            out.append(int(rng.choice(self.names)))
            return False
        plural = bool(rng.random() < 0.45)
        out.append(int(rng.choice(self.det_plur if plural else self.det_sing)))
        for _ in range(rng.choice(3, p=[0.55, 0.35, 0.10])):
            out.append(int(self.adj[rng.choice(40, p=self.adj_p[topic])]))
        noun = rng.choice(100, p=self.noun_p[topic])
        out.append(int((self.noun_plur if plural else self.noun_sing)[noun]))
        if depth == 0 and rng.random() < 0.3:
            out.append(int(rng.choice(self.prep)))
            self.noun_phrase(rng, topic, out, depth + 1)
        return plural

    def sentence(self, rng, topic: int, out: list[int], tags: list[int], depth: int = 0) -> None:
        """Append one sentence (without its final '.'), tagging verbs that must agree."""
        start = len(out)
        plural = self.noun_phrase(rng, topic, out, 0)
        tags.extend([TAG_OTHER] * (len(out) - start))
        r = rng.random()
        if depth < 2 and r < 0.15:
            out.append(self.special["say" if plural else "says"])
            tags.append(TAG_VERB)
            out.append(self.special["that"])
            tags.append(TAG_OTHER)
            self.sentence(rng, topic, out, tags, depth + 1)
            return
        if r < 0.6:
            verb = rng.choice(26, p=self.trans_p[topic])
            out.append(int((self.trans_plur if plural else self.trans_sing)[verb]))
            tags.append(TAG_VERB)
            start = len(out)
            self.noun_phrase(rng, topic, out, 0)
            tags.extend([TAG_OTHER] * (len(out) - start))
        else:
            verb = rng.choice(14, p=self.intrans_p[topic])
            out.append(int((self.intrans_plur if plural else self.intrans_sing)[verb]))
            tags.append(TAG_VERB)

    def document(self, rng) -> tuple[list[int], list[int]]:
        topic = int(rng.integers(N_TOPICS))
        out, tags = [self.special["<bos>"]], [TAG_OTHER]
        previous: list[int] | None = None  # the last fresh sentence, if it was just said
        for _ in range(int(rng.integers(6, 20))):
            if previous is not None and rng.random() < 0.25:
                out += [self.special["again"], self.special[":"], *previous, self.special["."]]
                tags += [TAG_OTHER, TAG_OTHER] + [TAG_COPY] * len(previous) + [TAG_OTHER]
                previous = None
                continue
            s: list[int] = []
            s_tags: list[int] = []
            self.sentence(rng, topic, s, s_tags)
            if rng.random() < 0.15:  # "S , and S ."
                s.append(self.special[","])
                s.append(self.special["and"])
                s_tags += [TAG_OTHER, TAG_OTHER]
                self.sentence(rng, topic, s, s_tags)
            previous = s
            out += [*s, self.special["."]]
            tags += [*s_tags, TAG_OTHER]
        return out, tags

    def corpus(self, rng, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        tokens: list[int] = []
        tags: list[int] = []
        while len(tokens) < n_tokens:
            doc, doc_tags = self.document(rng)
            tokens += doc
            tags += doc_tags
        return np.array(tokens[:n_tokens], np.uint16), np.array(tags[:n_tokens], np.uint8)


def train(args, lang: Language, train_tokens, val_tokens, val_tags):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10_000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").float()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup - 1)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    all_tokens = torch.from_numpy(train_tokens.astype(np.int64))
    gen = torch.Generator().manual_seed(args.seed)

    def evaluate() -> dict[str, float]:
        n = len(val_tokens) // (args.seq_len + 1)
        ids = torch.from_numpy(val_tokens[: n * (args.seq_len + 1)].astype(np.int64).reshape(n, -1))
        tags = val_tags[: n * (args.seq_len + 1)].reshape(n, -1)[:, 1:]
        model.eval()
        sing = np.concatenate([lang.trans_sing, lang.intrans_sing, [lang.special["says"]]])
        plur = np.concatenate([lang.trans_plur, lang.intrans_plur, [lang.special["say"]]])
        losses, correct, agree = [], [], []
        with torch.no_grad():
            for i in range(0, n, 64):
                logits = model(input_ids=ids[i : i + 64, :-1]).logits
                target = ids[i : i + 64, 1:]
                losses.append(
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB_SIZE), target.reshape(-1), reduction="none"
                    ).numpy()
                )
                correct.append((logits.argmax(-1) == target).reshape(-1).numpy())
                # Agreement: does the verb's correct number get more probability than the wrong?
                p, tgt = logits.softmax(-1).numpy(), target.numpy()
                mass_s, mass_p = p[..., sing].sum(-1), p[..., plur].sum(-1)
                right = np.where(np.isin(tgt, sing), mass_s > mass_p, mass_p > mass_s)
                agree.append(right[tags[i : i + 64] == TAG_VERB])
        model.train()
        loss, hit, t = np.concatenate(losses), np.concatenate(correct), tags.reshape(-1)
        return {
            "val_loss": float(loss.mean()),
            "agreement": float(np.concatenate(agree).mean()),
            "acc_copy": float(hit[t == TAG_COPY].mean()),
            "acc_other": float(hit[t == TAG_OTHER].mean()),
        }

    before = evaluate()
    print(
        f"model: {n_params:,} params; training {args.steps} steps of {args.batch} x {args.seq_len} "
        f"tokens ({args.steps * args.batch * args.seq_len / len(train_tokens):.1f} epochs), 1 thread"
    )
    curve = []
    start = time.perf_counter()
    running = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        # Windows at random offsets; labels=inputs because transformers shifts them itself.
        starts = torch.randint(0, len(all_tokens) - args.seq_len, (args.batch,), generator=gen)
        batch = all_tokens[starts[:, None] + torch.arange(args.seq_len)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % args.log_every == 0 or step == 0:
            curve.append((step + 1, float(np.mean(running))))
            print(
                f"  step {step + 1:5d}  train loss {np.mean(running):.4f}  lr {lr_at(step):.2e}  "
                f"{time.perf_counter() - start:6.1f}s",
                flush=True,
            )
            running = []
    after = evaluate()
    elapsed = time.perf_counter() - start
    return model, curve, before, after, elapsed


def save(model, lang: Language, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for fname in ("config.json", "model.safetensors"):
            (out / fname).write_bytes((Path(tmp) / fname).read_bytes())
    (out / "vocab.json").write_text(json.dumps(lang.words) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-tokens", type=int, default=960_000)
    parser.add_argument("--val-tokens", type=int, default=65_536)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    lang = Language(rng)
    train_tokens, _ = lang.corpus(np.random.default_rng([args.seed, 1]), args.train_tokens)
    val_tokens, val_tags = lang.corpus(np.random.default_rng([args.seed, 2]), args.val_tokens)
    used = len(set(train_tokens.tolist()))
    print(
        f"corpus: {len(train_tokens):,} train + {len(val_tokens):,} held-out tokens, "
        f"{used} of {VOCAB_SIZE} token ids used; unigram entropy "
        f"{unigram_entropy(train_tokens):.3f} nats"
    )

    model, curve, before, after, elapsed = train(args, lang, train_tokens, val_tokens, val_tags)

    args.out.mkdir(parents=True, exist_ok=True)
    save(model, lang, args.out / "tiny_llama")
    np.save(args.out / "tiny_corpus.npy", train_tokens)
    np.save(args.out / "tiny_corpus_val.npy", val_tokens)

    print(f"trained in {elapsed:.0f}s")
    print("loss curve (step: mean train loss over the preceding log window):")
    print("  " + ", ".join(f"{s}: {v:.3f}" for s, v in curve))
    for name, d in (("before", before), ("after", after)):
        print(
            f"held-out {name}: loss {d['val_loss']:.3f}; verbs given the right number "
            f"{d['agreement']:.3f}; next-token accuracy on copied words {d['acc_copy']:.3f}, "
            f"on all other tokens {d['acc_other']:.3f}"
        )
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"  {p.relative_to(args.out)}: {p.stat().st_size / 1024:.0f} KiB")


def unigram_entropy(tokens: np.ndarray) -> float:
    counts = np.bincount(tokens.astype(np.int64))
    p = counts[counts > 0] / len(tokens)
    return float(-(p * np.log(p)).sum())


if __name__ == "__main__":
    main()
