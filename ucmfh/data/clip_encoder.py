"""CLIP image and text features (pooled and, for SEPS, tokens) from ``transformers``, offline: a model is
a local folder or already in the local Hugging Face cache; nothing is ever downloaded."""
from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ucmfh.data.format import DataError
from ucmfh.utils import resolve_device

DEFAULT_MODEL = "openai/clip-vit-base-patch32"


def _looks_like_path(model: str) -> bool:
    """A hub name is ``name`` or ``owner/name``; anything else can only be meant as a folder."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if model.startswith((".", "~", "/", os.sep)) or model.endswith(("/", os.sep)):
        return True
    try:
        validate_repo_id(model)
    except HFValidationError:
        return True
    return False


def find_model(model: str) -> str:
    """``model`` when it is on this machine: a local folder, or a hub name in the local Hugging Face cache.

    Nothing is ever downloaded; a model that is not here is a
    :class:`FileNotFoundError` naming it.
    """
    if not model:
        raise ValueError("an empty model name; give a local model folder or a model in the Hugging Face cache")
    if os.path.exists(model):
        if not os.path.isdir(model):
            raise NotADirectoryError(f"{model}: not a model folder (it is a file)")
        return model
    if _looks_like_path(model):
        raise FileNotFoundError(f"{model}: no such local model folder")
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise FileNotFoundError(
            f"{model}: not found locally (no such folder, and not in the local Hugging Face cache); "
            "extraction does not download models: download it once on a machine with network access "
            f"(`hf download {model}`) or pass a folder written by save_pretrained"
        )
    return model


def model_digest(model: str) -> str:
    """SHA-256 of the files of a model found by :func:`find_model` (a local folder's, or its snapshot's in the
    Hugging Face cache): the same on every machine holding the same model, whatever its folder, and another for
    weights trained on into the same folder."""
    if os.path.isdir(model):
        folder = model
    else:
        from huggingface_hub import try_to_load_from_cache

        folder = os.path.dirname(try_to_load_from_cache(model, "config.json"))
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def _load(model: str) -> Tuple[Any, Any, Any]:
    """A local folder's CLIP model, tokenizer and image processor, checked: of a CLIP model, every weight there
    (the weights of a model of another kind were loaded as a CLIP of random weights), the processor's images of
    the model's size; ``DataError`` naming the folder otherwise, a damaged file among them."""
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    try:
        kind = AutoConfig.from_pretrained(model, local_files_only=True).model_type
        if kind != "clip":
            raise DataError(f"{model}: a model of type {kind!r}, not CLIP")
        clip, loading = CLIPModel.from_pretrained(model, local_files_only=True, output_loading_info=True)
        missing = list(loading.get("missing_keys") or ())
        if missing:
            raise DataError(f"{model}: {len(missing)} of the CLIP model's weights are not in the folder (first: "
                            f"{missing[0]}): they would be random")
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        processor = AutoImageProcessor.from_pretrained(model, local_files_only=True)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - files missing, of another kind or damaged (safetensors' own errors)
        raise DataError(f"{model}: not a complete CLIP model (model, tokenizer and image processor): "
                        f"{type(err).__name__}: {' '.join(str(err).split())}") from None
    words, vocabulary = len(tokenizer), int(clip.config.text_config.vocab_size)
    if words < vocabulary:  # a folder without its tokenizer's files: a tokenizer of its special tokens alone made
        # every caption the same unknown tokens, and every caption's features one row
        raise DataError(f"{model}: its tokenizer knows {words} tokens, its model {vocabulary}: the tokenizer's "
                        "files (tokenizer.json, or vocab.json and merges.txt) are missing or of another model")
    size, crop = clip.config.vision_config.image_size, getattr(processor, "crop_size", None)
    height = crop.get("height") if isinstance(crop, dict) else getattr(crop, "height", None)  # or a SizeDict
    if height not in (None, size):
        raise DataError(f"{model}: its image processor makes images of {height} pixels, its model takes {size}")
    return clip, tokenizer, processor


class ClipEncoder:
    """CLIP image and text embeddings (projected) from ``transformers``, offline.

    ``model`` is a local folder written by ``save_pretrained`` holding the
    model, tokenizer and image processor, or a Hugging Face model name (e.g.
    ``openai/clip-vit-base-patch32``) already in the local Hugging Face cache.
    Nothing is downloaded (:func:`find_model`).
    """

    def __init__(self, model: str = DEFAULT_MODEL, device: Optional[str] = None, normalize: bool = False):
        for module, package in (("transformers", "transformers"), ("PIL", "pillow")):  # pillow: the image processor's,
            try:  # which transformers refused in a paragraph said of the model's folder, a text search's too
                importlib.import_module(module)
            except ImportError as err:
                raise ImportError(f"feature extraction needs {package}: pip install 'ucmfh[extract]'") from err
        from transformers.utils import logging as hf_logging
        self.device = resolve_device(device or "auto")  # ValueError naming the device
        find_model(model)
        shown, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()  # its 'Loading weights' bar, above a search's results
        hf_logging.set_verbosity_error()  # its report of the weights it lacks, said here in one line instead
        try:
            self.model, self.tokenizer, self.processor = _load(model)
        finally:
            hf_logging.set_verbosity(verbosity)
            if shown:
                hf_logging.enable_progress_bar()
        self.model = self.model.eval().to(self.device)
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.normalize = normalize
        self.name = model
        self._digest: Optional[str] = None

    @property
    def digest(self) -> str:
        """:func:`model_digest` of its model, read once when asked (an extraction's, which goes on with the chunks
        of these files alone; a text search never asks: it hashed a gigabyte of weights a query)."""
        if self._digest is None:
            self._digest = model_digest(self.name)
        return self._digest

    def _finish(self, x: torch.Tensor) -> np.ndarray:
        if self.normalize:
            x = torch.nn.functional.normalize(x, dim=-1)
        return x.float().cpu().numpy()

    def prepare_image(self, image) -> torch.Tensor:
        """A PIL image as the model's input, [3, S, S] pixel values: what :meth:`encode_images` does to each image
        of its batch, done apart (extraction does it as each image is read, in its loading threads, so that a batch
        holds these and not the decoded photos: 64 of 24 megapixels were 11 GB)."""
        return self.processor(images=[image], return_tensors="pt")["pixel_values"][0]

    def _pixels(self, images: list) -> torch.Tensor:
        """[B, 3, S, S] on the device: of PIL images, or of their :meth:`prepare_image` (the same values)."""
        if images and isinstance(images[0], torch.Tensor):
            return torch.stack(images).to(self.device)
        return self.processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)

    @torch.inference_mode()
    def encode_images(self, images: list) -> np.ndarray:
        """[B] PIL images (or their :meth:`prepare_image`) → [B, d] float32."""
        pixels = self._pixels(images)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return self._finish(self.model.visual_projection(pooled))

    def cut_texts(self, texts: List[str]) -> List[int]:
        """The positions of the texts longer than the model's context (start and end tokens included), which
        :meth:`encode_texts` cuts to it: said by the extraction, where they were cut without a word."""
        lengths = self.tokenizer(texts, truncation=False, verbose=False)["input_ids"]
        return [i for i, ids in enumerate(lengths) if len(ids) > self.max_length]

    @torch.inference_mode()
    def encode_texts(self, texts: List[str]) -> np.ndarray:
        """[B] strings → [B, d] float32 (truncated to the model's context length)."""
        tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(self.device)
        pooled = self.model.text_model(input_ids=tokens["input_ids"],
                                       attention_mask=tokens["attention_mask"]).pooler_output
        return self._finish(self.model.text_projection(pooled))

    @torch.inference_mode()
    def encode_images_tokens(self, images: list) -> Tuple[np.ndarray, np.ndarray]:
        """[B] PIL images (or their :meth:`prepare_image`) → the pooled [B, d] float32 of :meth:`encode_images` and
        the tokens [B, T, C] float16.

        The tokens are the vision tower's last hidden state after its post-layernorm, not projected:
        token 0 is [CLS] (post-layernorm [CLS] is CLIP's pooled output), tokens 1.. the patches row by row.
        """
        pixels = self._pixels(images)
        vision = self.model.vision_model(pixel_values=pixels)
        tokens = self.model.vision_model.post_layernorm(vision.last_hidden_state)
        pooled = self._finish(self.model.visual_projection(vision.pooler_output))
        return pooled, tokens.to(torch.float16).cpu().numpy()

    @torch.inference_mode()
    def encode_texts_tokens(self, texts: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[str]]:
        """[B] strings → the pooled [B, d] float32 of :meth:`encode_texts`, the word tokens [ΣL, C] float16,
        their count per text [B] int64 and the token string of each row [ΣL].

        The rows are the text tower's last hidden state (after its final layernorm, not projected) at the
        real tokens only: no start/end token, no padding. CLIP's attention is causal, so padding a batch
        changes none of them.
        """
        tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                return_special_tokens_mask=True, return_tensors="pt")
        text = self.model.text_model(input_ids=tokens["input_ids"].to(self.device),
                                     attention_mask=tokens["attention_mask"].to(self.device))
        real = tokens["attention_mask"].bool() & ~tokens["special_tokens_mask"].bool()  # [B, L_max]
        rows = text.last_hidden_state[real.to(self.device)]  # row-major: text by text, in order
        words = self.tokenizer.convert_ids_to_tokens(tokens["input_ids"][real].tolist())
        pooled = self._finish(self.model.text_projection(text.pooler_output))
        return pooled, rows.to(torch.float16).cpu().numpy(), real.sum(dim=1).numpy().astype(np.int64), words

    @staticmethod
    def describe_tokens(model: str, n_image_tokens: int, d_img: int, d_txt: int) -> Dict[str, str]:
        """What :meth:`encode_images_tokens` and :meth:`encode_texts_tokens` compute, for the root attributes."""
        grid = int(round((n_image_tokens - 1) ** 0.5))
        patches = f"the {grid}x{grid} patches row by row" if grid * grid == n_image_tokens - 1 else "the patches"
        return {
            "image_tokens": (
                f"image_tokens [N,{n_image_tokens},{d_img}] float16: CLIP {model} vision tower (transformers "
                f"CLIPModel.vision_model), last hidden state after post_layernorm, all {n_image_tokens} tokens: "
                f"token 0 = [CLS] (root attribute image_tokens_cls), tokens 1..{n_image_tokens - 1} = {patches}; "
                f"NOT projected (the tower's width {d_img}; visual_projection of token 0 is the pooled image "
                "feature before any normalisation), NOT normalised, cast to float16 from the model's float32"),
            "text_tokens": (
                f"text_tokens [sumL,{d_txt}] float16: CLIP {model} text tower (CLIPModel.text_model), last "
                "hidden state (after final_layer_norm) of each caption, batched with padding (causal attention: "
                "padding changes no real token), truncated to the model's context length; rows of the real "
                "tokens only (start token, end token and padding dropped), NOT projected, NOT normalised, cast "
                "to float16. CSR: item i owns rows text_offsets[i]:text_offsets[i+1] (text_offsets [N+1] "
                "int64). text_words [sumL] UTF-8: the tokenizer's token string of each row (CLIP BPE, '</w>' "
                "ends a word). text_raw [N] UTF-8: the caption encoded."),
        }


# how an image file becomes the RGB picture a model sees (:func:`load_image`); part of extraction's scratch
# fingerprint, so that chunks of an earlier way are never mixed with this one's
IMAGE_LOADING = "exif-upright, 16-bit scaled, alpha over white"
# 16-bit samples as PIL opens them (grey PNGs and TIFFs): 'I;16*' always, 'I' (32-bit integers) where a value is
# over 255 and every one fits 16 bits (values of 8 bits alone are taken as they are)
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def load_image(path: str):
    """An RGB PIL image, decoded in full, as a viewer shows it: turned upright by its EXIF orientation (a phone's
    photo was encoded on its side), 16-bit grey scaled to 8 bits (converted as it was, every value over 255 became
    white), transparency over white, as CLIP's own processor composes it (converted as it was, a transparent
    pixel showed the colour hidden under it). Raises OSError for an unreadable or truncated file, or a floating-
    point image, whose values have no range to scale."""
    from PIL import Image, ImageFile, ImageOps

    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # someone allowed truncated images globally; a half-grey image must not become a feature
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set; unset it for extraction")
    # PIL's own warning: its file and line, and no image named; said below instead. Set at each call (it replaces
    # itself): a caller's warnings.catch_warnings would take one set once away
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)  # a copy, decoded
            im.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise OSError(f"{path}: unreadable image ({type(err).__name__}: {err})") from None
    if Image.MAX_IMAGE_PIXELS and im.width * im.height > Image.MAX_IMAGE_PIXELS:
        warnings.warn(f"{path}: an image of {im.width * im.height / 1e6:.3g} megapixels, which PIL warns of as a "
                      "possible decompression bomb; read whole", stacklevel=2)
    if im.mode == "F":
        raise OSError(f"{path}: a floating-point image (mode F), whose values have no range to scale to 8 bits; "
                      "save it as an 8- or 16-bit image")
    if im.mode in _SIXTEEN_BIT or im.mode == "I":
        values = np.asarray(im, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise OSError(f"{path}: a 32-bit integer image (mode I) of values beyond 16 bits, which have no range "
                          "to scale to 8 bits; save it as an 8- or 16-bit image")
        if im.mode == "I" and (not values.size or values.max() <= 255):  # 32-bit integers of 8-bit values
            scaled = values.astype(np.uint8)
        else:
            scaled = ((values * 255 + 32767) // 65535).astype(np.uint8)
        im = Image.fromarray(scaled, "L")
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return im.convert("RGB")


