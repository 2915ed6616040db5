#!/usr/bin/env python3
"""test_cli.py — the command-line tools as a user runs them (real processes).

strata-run: greedy completions of the reference prompts equal llama.cpp's
tokens and text (--json), the streamed text equals the JSON text, the top
logprobs are present, seeded sampling is reproducible, and bad flags (exit 2)
or bad model files (exit 1) end in a one-line error.
strata-gguf: inspect prints the tensor table of stories260K; usage errors
exit 2 and corrupt files exit 1 with the byte offset.

usage: test_cli.py STRATA_RUN STRATA_GGUF SHARED_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

RUN, GGUF, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SHARED, "models", "stories260K.gguf")
FAILS = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS.append(what)


def run(args, timeout=120):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


refs = json.load(open(os.path.join(SHARED, "reference", "stories260K-greedy.json")))

# Greedy, JSON: tokens and text equal the reference for three prompts.
for ref in refs[:3]:
    rc, out, err = run([RUN, "--model", MODEL, "--prompt", ref["prompt"], "-n", "64",
                        "--temp", "0", "--json", "--top-logprobs", "3"])
    check(rc == 0, "strata-run --json exits 0 for %r (%s)" % (ref["prompt"], err.strip()))
    if rc != 0:
        continue
    j = json.loads(out)
    check(j["prompt_tokens"] == ref["prompt_tokens"], "prompt tokens of %r" % ref["prompt"])
    check(j["completion_tokens"] == ref["completion_tokens"], "64 greedy tokens of %r" % ref["prompt"])
    check(j["text"] == ref["completion_text"], "completion text of %r" % ref["prompt"])
    check(len(j["steps"]) == 64 and all(len(s["top_logprobs"]) == 3 for s in j["steps"]),
          "64 steps with 3 top logprobs each")
    first = j["steps"][0]["top_logprobs"]
    want = ref["top3_logprobs_first4"][0]
    check([t[0] for t in first] == [t[0] for t in want], "top-3 ids of the first step")
    for key in ("ttft_s", "prefill_tok_s", "decode_tok_s"):
        check(isinstance(j.get(key), float) and j[key] > 0, "%s is a positive number" % key)

# Streaming text equals the JSON text (TP 2 as well).
ref = refs[0]
rc, out, _ = run([RUN, "--model", MODEL, "--prompt", ref["prompt"], "-n", "64", "--temp", "0",
                  "--tp", "2"])
check(rc == 0 and out == ref["completion_text"] + "\n", "streamed text at TP 2 equals the reference")

# Stop string: the text ends before it.
rc, out, _ = run([RUN, "--model", MODEL, "--prompt", ref["prompt"], "-n", "64", "--temp", "0",
                  "--stop", "park"])
check(rc == 0 and out == ref["completion_text"].split("park")[0] + "\n", "stop string cuts the text")

# Seeded sampling is reproducible; another seed differs.
outs = [run([RUN, "--model", MODEL, "--prompt", "Once upon a time", "-n", "48", "--temp", "0.9",
             "--seed", str(s), "--json"])[1] for s in (7, 7, 8)]
toks = [json.loads(o)["completion_tokens"] for o in outs]
check(toks[0] == toks[1], "same seed, same tokens")
check(toks[0] != toks[2], "another seed, other tokens")

# Bad command lines: exit 2 and one line on stderr.
for args, what in (([RUN, "--bogus"], "unknown flag"),
                   ([RUN, "--model", MODEL], "missing --prompt"),
                   ([RUN, "--model", MODEL, "--prompt", "x", "--tp", "0"], "--tp 0"),
                   ([RUN, "--model", MODEL, "--prompt", "x", "--temp", "abc"], "--temp abc"),
                   ([RUN, "--model", MODEL, "--prompt", "x", "--top-logprobs", "2"], "--top-logprobs without --json"),
                   ([GGUF], "strata-gguf without a command"),
                   ([GGUF, "inspect"], "strata-gguf inspect without FILE"),
                   ([GGUF, "frobnicate"], "strata-gguf unknown command")):
    rc, out, err = run(args)
    check(rc == 2 and len(err.strip().splitlines()) >= 1, "%s exits 2 (rc %d)" % (what, rc))
rc, _, err = run([RUN, "--model", MODEL, "--prompt", "x", "--tp", "3"])
check(rc == 1 and "not divisible" in err and len(err.strip().splitlines()) == 1,
      "--tp 3 on 8 heads: one-line error, exit 1 (%r)" % err.strip())

# Bad model files: exit 1, one line naming the file and the byte offset.
with tempfile.TemporaryDirectory() as d:
    trunc = os.path.join(d, "trunc.gguf")
    with open(MODEL, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read(1000))
    notgguf = os.path.join(d, "text.gguf")
    with open(notgguf, "w") as g:
        g.write("hello, this is not a model\n")
    for path in (trunc, notgguf, os.path.join(d, "missing.gguf")):
        rc, out, err = run([RUN, "--model", path, "--prompt", "x"])
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and path in lines[0],
              "strata-run on %s: exit 1 and one line naming it (%r)" % (os.path.basename(path), err.strip()))
    rc, out, err = run([GGUF, "inspect", trunc])
    check(rc == 1 and "at byte" in err, "strata-gguf inspect on a truncated file names the byte (%r)" % err.strip())

# inspect: the tensor table of stories260K.
rc, out, err = run([GGUF, "inspect", MODEL])
check(rc == 0, "strata-gguf inspect exits 0")
line = [l for l in out.splitlines() if "blk.0.attn_k.weight" in l]
check(len(line) == 1 and "f32" in line[0] and "64" in line[0] and "32" in line[0],
      "inspect lists blk.0.attn_k.weight, f32, 64 x 32: %r" % (line[0] if line else None))
check("llama.block_count" in out and "tokenizer.ggml.tokens" in out, "inspect prints the metadata")
check(out.count(".weight") >= 48, "inspect lists the 48 tensors")

print("%d failures" % len(FAILS))
sys.exit(1 if FAILS else 0)
