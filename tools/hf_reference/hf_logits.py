#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for Loom's tests.

    python3 hf_logits.py MANIFEST.json OUT.json

MANIFEST.json (written by make_models.sh) lists Hugging Face folders (written
by `loom synth --format safetensors`) and the token ids to evaluate. For each
folder this loads the model with transformers in float32 on the CPU (eager
attention, so gemma2's soft-capping and sliding window are the reference's
own), runs one forward pass over the tokens and keeps every position's
logits. It also keeps the float64 sum of the token embedding, so a test can
tell "the synthetic weights changed" from "the logits differ".

tests/unit/hf_reference_test.cpp reads OUT.json (kept as
tests/data/hf_reference.json). Run this on a machine with torch and
transformers (the GPU machine of the device tool has both).
"""
import json
import os
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM


def load(folder):
    kw = dict(attn_implementation="eager")
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, **kw)


def with_config(folder, changes):
    """The folder itself, or a copy (links to its files) whose config.json
    has `changes` set: the manifest's "config" entry."""
    if not changes:
        return folder
    tmp = tempfile.mkdtemp(prefix="hfref-")
    for name in os.listdir(folder):
        if name != "config.json":
            os.symlink(os.path.join(folder, name), os.path.join(tmp, name))
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return tmp


def main():
    manifest_path, out_path = sys.argv[1], sys.argv[2]
    with open(manifest_path) as f:
        manifest = json.load(f)
    base = os.path.dirname(os.path.abspath(manifest_path))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    out = {
        "generator": "transformers %s, torch %s: float32 on the CPU, eager attention"
        % (transformers.__version__, torch.__version__),
        "tokens": manifest["tokens"],
        "models": [],
    }
    ids = torch.tensor([manifest["tokens"]], dtype=torch.long)
    for m in manifest["models"]:
        model = load(with_config(os.path.join(base, m["folder"]), m.get("config")))
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].double()
        embd = model.get_input_embeddings().weight.detach().double()
        entry = dict(m)
        entry["hf_class"] = type(model).__name__
        entry["embedding_sum"] = float(embd.sum())
        entry["logits"] = [[float("%.7g" % x) for x in row.tolist()] for row in logits]
        out["models"].append(entry)
        print("%-16s %-22s logits %s, argmax %s" % (m["name"], entry["hf_class"],
              tuple(logits.shape), logits.argmax(-1).tolist()), flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
