#!/usr/bin/env python3
"""llama.cpp's reference outputs for the requantized SmolLM2 files (tests/tests/quant_reference.rs).

  tests/reference/make-smollm2-quant-refs.py TYPE...      # e.g. Q4_K_M Q6_K

For each TYPE, reads models/SmolLM2-135M-Instruct.TYPE.gguf (scripts/make-quant-models.sh makes
it) and writes tests/reference/smollm2-<type>/:
  greedy.jsonl        ../shared/peer/llama-ref.py greedy --n 32 over the eight prompts of
                      ../shared/reference/smollm2/greedy.jsonl (prompt as one batch, then one
                      token per eval).
  logits-top10.jsonl  teacher-forced top-10 logits at every position, with the prompt fed ONE
                      TOKEN PER EVAL (llama.cpp's single-token path, the path edge-run's
                      `Session::step` mirrors; llama-ref.py's `logits` feeds the prompt as one
                      batch, whose kernels add in another order). Prompts: the three of
                      ../shared/reference/smollm2/logits-top10.jsonl, then the eight greedy
                      prompts each followed by its 32-token Q4_1 continuation text.
llama.cpp: the peer build (../shared/peer/build-llama-cpp.sh), 1 thread, ctx 2048; or the build
directory `$EDGE_RUN_PEER_BIN` names (a build of the same source with other CPU flags, e.g.
without AVX-VNNI on a CPU that has AVX-512 VNNI but not the VEX form, where the peer's build
stops at an illegal instruction).

  tests/reference/make-smollm2-quant-refs.py Q4_1   # the Q4_1 file itself: smollm2-q4_1/, whose
                                                    # logits along the greedy continuations judge
                                                    # near-ties in tests/tests/cuda_reference.rs
"""
import json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SHARED = os.path.join(ROOT, "..", "shared")


def main():
    types = sys.argv[1:]
    peer = os.path.join(SHARED, "peer")
    bindir = os.environ.get("EDGE_RUN_PEER_BIN") or subprocess.check_output(
        [os.path.join(peer, "build-llama-cpp.sh")], text=True).strip()
    os.environ["LLAMA_CPP_LIB_PATH"] = bindir
    sys.path.insert(0, os.path.abspath(os.path.join(bindir, "../../../..")))  # llama_cpp_python-*/
    import numpy as np
    from llama_cpp import Llama

    ref = os.path.join(SHARED, "reference", "smollm2")
    greedy = [json.loads(l) for l in open(os.path.join(ref, "greedy.jsonl")) if l.strip()]
    logit_prompts = [json.loads(l)["prompt"] for l in open(os.path.join(ref, "logits-top10.jsonl")) if l.strip()]
    logit_prompts += [g["prompt"] + g["text"] for g in greedy]
    for t in types:
        model = os.path.join(ROOT, "models", f"SmolLM2-135M-Instruct.{t}.gguf")
        out = os.path.join(HERE, f"smollm2-{t.lower()}")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "greedy.jsonl"), "w") as f:
            inp = "".join(json.dumps({"prompt": g["prompt"]}) + "\n" for g in greedy)
            f.write(subprocess.run([sys.executable, os.path.join(peer, "llama-ref.py"), "--model", model,
                                    "greedy", "--n", "32"], input=inp, capture_output=True, text=True,
                                   check=True).stdout)
        m = Llama(model, n_ctx=2048, n_threads=1, n_batch=512, logits_all=True, verbose=False)
        with open(os.path.join(out, "logits-top10.jsonl"), "w") as f:
            for p in logit_prompts:
                ids = m.tokenize(p.encode(), add_bos=False, special=True)
                m.reset()
                top = []
                for pos, tok in enumerate(ids):
                    m.eval([tok])
                    row = np.asarray(m.scores[pos], dtype=np.float64)
                    idx = np.argsort(-row)[:10]
                    top.append([[int(i), round(float(row[i]), 4)] for i in idx])
                f.write(json.dumps({"prompt": p, "prompt_ids": ids, "top": top}, ensure_ascii=False) + "\n")
        del m
        print("done", t, file=sys.stderr)


if __name__ == "__main__":
    main()
