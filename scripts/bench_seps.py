"""The cost of scoring image–caption pairs with SEPS: ucmfh's pair-batched grid against the released
code's loop over captions (docs/reference.md §8, defect 3), on random tokens of real shapes.

The released code's way, per caption: score every image's patches, top-K, gather the kept patches,
run the aggregation MLP on them (again for every caption), build the tokens, HRPA. ucmfh's way:
everything that depends on one side once (:meth:`SEPS.encode_images`), then :meth:`SEPS.grid`.
Both give the same scores (tests/seps/test_seps.py checks it pair by pair); this prints ms per pair.

    python scripts/bench_seps.py --patches 49 --patches 196 --threads 1
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from ucmfh.config import SepsConfig
from ucmfh.seps.model import SEPS
from ucmfh.similarity import normalize


def released_code_way(model: SEPS, img_tok: torch.Tensor, words: torch.Tensor, lengths) -> torch.Tensor:
    """Scores [texts, images], one caption at a time over a batch of images (the released code's loop)."""
    v = model.img_proj(img_tok)
    vn = normalize(v)
    s_im = (vn * normalize(v.mean(1, keepdim=True))).sum(-1)
    w_all = model.txt_proj(words)
    out = torch.empty(len(lengths), img_tok.shape[0])
    for t, n_words in enumerate(lengths):
        w = w_all[t, :n_words]
        score = s_im + vn @ normalize(w.mean(0))
        order = score.argsort(dim=1, descending=True)
        keep, drop = order[:, :model.n_keep], order[:, model.n_keep:]
        kept = torch.gather(vn, 1, keep[..., None].expand(-1, -1, vn.shape[-1]))
        dropped = torch.gather(vn, 1, drop[..., None].expand(-1, -1, vn.shape[-1]))
        extra = (torch.softmax(torch.gather(score, 1, drop), 1)[..., None] * dropped).sum(1, keepdim=True)
        weights = torch.softmax(model.aggr["sparse"](kept).transpose(1, 2), dim=2)
        tokens = normalize(torch.cat([vn.mean(1, keepdim=True), weights @ kept, extra], dim=1))
        a = F.leaky_relu(normalize(w)[None] @ tokens.transpose(1, 2), 0.1)  # [V, words, tokens]
        out[t] = a.max(2).values.mean(1) + a.max(1).values.mean(1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, action="append", help="patches per image (repeatable)")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--texts", type=int, default=100)
    parser.add_argument("--words", type=int, default=12, help="mean words per caption (lengths 0.5x..1.5x)")
    parser.add_argument("--d-img", type=int, default=768)
    parser.add_argument("--d-txt", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lengths = torch.randint(args.words // 2, args.words * 3 // 2 + 1, (args.texts,)).tolist()
    words = torch.randn(args.texts, max(lengths), args.d_txt)
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    print(f"{args.images} images x {args.texts} captions ({args.words} words on average), C = 512, "
          f"{args.threads} thread(s), torch {torch.__version__}")
    print(f"{'patches':>8}{'released loop ms/pair':>24}{'ucmfh grid ms/pair':>21}{'speed-up':>10}{'max |diff|':>12}")
    for n in args.patches or [49, 196]:
        model = SEPS(args.d_img, args.d_txt, n, SepsConfig(selection="frozen")).eval()
        img_tok = torch.randn(args.images, n, args.d_img)
        with torch.no_grad():
            start = time.perf_counter()
            slow = released_code_way(model, img_tok, words, lengths)
            slow_s = time.perf_counter() - start
            start = time.perf_counter()
            fast = model.grid(model.encode_images(img_tok), model.encode_texts(words, mask))[0]
            fast_s = time.perf_counter() - start
        pairs = args.images * args.texts
        print(f"{n:>8}{1000 * slow_s / pairs:>24.4f}{1000 * fast_s / pairs:>21.4f}{slow_s / fast_s:>9.1f}x"
              f"{(slow - fast).abs().max().item():>12.1e}")


if __name__ == "__main__":
    main()
