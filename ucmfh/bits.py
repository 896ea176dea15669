"""Binary codes as bits: the one packing of the package, in numpy alone (a search never imports torch).

Bit convention: a ±1 code is packed in ``numpy.packbits`` order (bit 0 of a code is the most
significant bit of its first byte); +1 is a set bit, -1 (and sign(0) = +1, docs/reference.md §5) a
clear one; the last byte is padded with zeros. The compiled kernels take the same bytes as uint64
words, zero-padded to whole words.

    codes [N, n_bits] ±1 or real ──pack──► bytes uint8 [N, ceil(n_bits / 8)] ──words──► uint64 [N, ceil(n_bits / 64)]
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

BIT_WEIGHTS = (1 << np.arange(7, -1, -1)).astype(np.uint8)  # packbits order: the first bit is the MSB
# the longest code: the compiled kernels count a distance in 16 bits (the metrics, an index, a codes file)
MAX_BITS = 0xFFFF


def check_n_bits(n_bits: int, what: str = "codes") -> None:
    """Refuse a code length outside 1 … MAX_BITS (``ValueError`` naming ``what``): codes of no bits tie every
    item, and the kernels refused longer ones in a message of their own sizes where torch scored them."""
    if not 1 <= n_bits <= MAX_BITS:
        raise ValueError(f"{what}: codes of {n_bits} bits; a code has 1 to {MAX_BITS:,} bits")


def n_words(n_bits: int) -> int:
    """uint64 words per code."""
    return -(-n_bits // 64)


def n_bytes(n_bits: int) -> int:
    """Packed bytes per code."""
    return -(-n_bits // 8)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy array of ``x``: a torch tensor (detached, on the host) or anything ``np.asarray`` takes."""
    torch = sys.modules.get("torch")  # a tensor exists only where torch was imported
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def check_signed(codes: Any, what: str = "codes", packed: bool = True) -> None:
    """Refuse ±1 codes given as 0 and 1 (or as booleans), the field's usual storage: a bit is the code's sign,
    so a 0 would read as +1 and every bit of such a code as set, every distance as 0, every score as chance's,
    without a word. Read from the first rows only (a ±1 or real-valued code is never exactly 0 and 1 alone).
    ``packed``: the caller takes packed bits too (the message offers them)."""
    head = to_numpy(codes[:64])
    zero_one = head.dtype.kind in "fi" and head.size > 0 and bool((head == 0).any()) and bool(
        ((head == 0) | (head == 1)).all())
    if head.dtype == np.bool_ or zero_one:
        if head.dtype != np.bool_ and not head.any():  # no 1 to say it of: real values of 0, or 0/1 codes all 0
            raise ValueError(f"{what}: every value of the first rows is 0, where a bit is the code's sign (0 would "
                             "read as +1, every code as all bits set): give ±1 codes or real values")
        raise ValueError(f"{what}: codes of 0 and 1, where a bit is the code's sign (0 would read as +1): give ±1 "
                         "codes (2 * codes - 1)" + (" or packed bits (numpy.packbits, uint8)" if packed else ""))


def check_packed(codes: Any, what: str = "codes") -> None:
    """Refuse, where packed bits (uint8) are read, bytes of 0 and 1 alone: codes of 0 and 1 (or labels) stored as
    uint8, each read as 8 bits, a 64-bit code as a 512-bit one, every score wrong without a word. Read from the
    first rows only: the bytes of packed codes are never 0 and 1 alone (each byte holds 8 bits)."""
    head = to_numpy(codes[:64])
    if head.size and bool((head == 1).any()) and bool((head == 0).any()) and bool(((head == 0) | (head == 1)).all()):
        raise ValueError(f"{what}: uint8 is read as packed bits (8 a byte), but every byte of the first rows is 0 or "
                         "1, as in codes of 0 and 1 (or labels) stored as uint8, and hardly ever in packed codes: if "
                         "they are 0/1 codes, give ±1 codes (2 * codes.astype(numpy.int8) - 1) or pack them "
                         "(numpy.packbits(codes, axis=1)); if they are packed codes, give them unpacked as ±1 codes")


def pack(codes: Any) -> np.ndarray:
    """±1 or real-valued codes, numpy or torch, as bits: sign >= 0 is a set bit.

    Shape: [N, n_bits] -> [N, ceil(n_bits / 8)] uint8.
    """
    codes = to_numpy(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be 2-D [N, n_bits], got shape {codes.shape}")
    return np.packbits(codes >= 0, axis=1)


def pack_labels(labels: Any) -> np.ndarray:
    """Multi-hot labels, a set bit per nonzero entry. Shape: [N, C] -> [N, ceil(C / 8)] uint8."""
    return np.packbits(to_numpy(labels) != 0, axis=1)


def words(packed: np.ndarray) -> np.ndarray:
    """Packed bytes [N, B] uint8 -> uint64 words [N, ceil(B / 8)], zero-padded, C-contiguous."""
    n, width = packed.shape
    out = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    out[:, :width] = packed
    return out.view(np.uint64)


def packed_bytes(codes: np.ndarray, n_bits: int) -> np.ndarray:
    """Words [N, W] uint64 -> packed bytes [N, ceil(n_bits / 8)] uint8 (a view where possible)."""
    return codes.view(np.uint8).reshape(codes.shape[0], -1)[:, : n_bytes(n_bits)]


def as_words(codes: Any, n_bits: int, what: str = "codes") -> np.ndarray:
    """Codes as the kernels' packed uint64 words [N, ceil(n_bits / 64)], C-contiguous.

    Accepts ±1 or real-valued codes [N, n_bits] (sign >= 0 is a set bit), packed bytes uint8
    [N, ceil(n_bits / 8)] (``numpy.packbits`` order) or words uint64 [N, ceil(n_bits / 64)], numpy or
    torch. Padding bits must be clear. ``what`` names the input in errors.
    """
    codes = to_numpy(codes)
    width = n_words(n_bits)
    if codes.ndim != 2:
        one = f" (one: {what}[None])" if codes.ndim == 1 else ""  # as the metrics say it
        raise ValueError(f"{what}: expected a 2-D array [N, {n_bits}], a row an item{one}, got shape {codes.shape}")
    if codes.dtype == np.uint64:
        if codes.shape[1] != width:
            raise ValueError(f"{what}: {codes.shape[1]} uint64 words per code, expected {width} for {n_bits} bits")
        out = np.ascontiguousarray(codes)
    else:
        if codes.dtype == np.uint8:
            if codes.shape[1] != n_bytes(n_bits):
                raise ValueError(f"{what}: {codes.shape[1]} packed bytes per code, expected {n_bytes(n_bits)} "
                                 f"for {n_bits} bits (pass ±1 codes as a signed or float array)")
            check_packed(codes, what)
            packed = codes
        else:
            if codes.shape[1] != n_bits:
                signs = codes.size > 0 and bool(np.isin(codes, (-1, 1)).all())
                hint = ("codes of another length: of another model than the index's" if signs else
                        "features are encoded first: ucmfh.search.Encoder(checkpoint).encode(features, modality)")
                raise ValueError(f"{what}: {codes.shape[1]} columns, the index holds {n_bits}-bit codes; {hint}")
            if codes.dtype.kind == "f" and not np.isfinite(codes).all():
                raise ValueError(f"{what}: non-finite values")
            check_signed(codes, what)
            packed = np.packbits(codes >= 0, axis=1)
        buf = np.zeros((codes.shape[0], width * 8), dtype=np.uint8)
        buf[:, : packed.shape[1]] = packed
        out = buf.view(np.uint64)
    if n_bits % 64 and len(out):
        # bit b of a code is bit 7 - b % 8 of byte b // 8; the padding is every bit from n_bits on
        pad = np.zeros(width * 8, dtype=np.uint8)
        pad[n_bits // 8 :] = 0xFF
        if n_bits % 8:
            pad[n_bits // 8] = (1 << (8 - n_bits % 8)) - 1
        if (out & pad.view(np.uint64)).any():
            raise ValueError(f"{what}: bits beyond bit {n_bits} are set")
    return out
