#!/usr/bin/python3
"""api_test.py — issue 7's acceptance tests of the OpenAI API, metrics and
logs on a real PP 2 cluster (strata-coordinator + 2 strata-worker processes on
stories260K, started and always stopped by the test; tests/cluster/
cluster_test.py's Cluster helper).

  api_test.py MODE --coordinator BIN --worker BIN --shared DIR [--build-dir DIR]

MODE
  openai     the official `openai` npm client (tests/openai: package.json +
             package-lock.json, installed with `npm ci` into
             BUILD_DIR/openai-client when missing) runs
             tests/openai/openai_client_test.mjs: completions and chat
             completions, streaming and not, greedy output == the reference,
             typed errors
  metrics    `promtool check metrics` accepts /metrics scraped while 8
             streaming requests run; the values move (requests, tokens, TTFT)
  load       64 concurrent streaming clients for STRATA_LOAD_SECONDS (60):
             no failed request, every stream ends in [DONE], coordinator RSS
             after warm-up grows < 5%; prints p50/p99 TTFT and tokens/s. The
             warm-up lasts until every client has finished 2 requests (and
             a quarter of the run, 10 s at most): all 64 streams have then
             run at once, whatever the machine's load; RSS is then watched
             for the rest of the run, at least half its length
  parity     issue 16 (vLLM parity), a table of cases: token-id prompts
             single and batched, n > 1 with seeds (streaming too), top_p 0,
             the sampling extras, unknown fields, chat control-token
             injection, /tokenize and /detokenize on the reference prompts
  bad-input  >= 30 malformed requests each get their documented status
             (docs/api.md) and an OpenAI error body; 429 when the queue is
             full; 503 while no placement serves; the server keeps serving
             (the next completion equals the reference)
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_test as ct  # noqa: E402  (Cluster, check, FAILS)
from harness import eventually, sse_events  # noqa: E402

check = ct.check


def load_ref(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        return json.load(f)


def request(cl, method, path, body=None, timeout=120, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def post(cl, path, obj):
    st, b = request(cl, "POST", path, json.dumps(obj).encode())
    return st, json.loads(b)


def stream(cl, path, obj, timeout=120):
    """Streams; returns dict(status, chunks, done, ttft, error)."""
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=timeout)
    t0 = time.time()
    out = {"status": None, "chunks": [], "done": False, "ttft": None, "error": None}
    try:
        c.request("POST", path, body=json.dumps(dict(obj, stream=True)).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["error"] = r.read()[:300]
            return out
        for j in sse_events(r):
            if j is None:
                out["done"] = True
                break
            if "error" in j:
                out["error"] = j["error"]
            out["chunks"].append(j)
            ch = j.get("choices") or [{}]
            piece = ch[0].get("text") or (ch[0].get("delta") or {}).get("content")
            if piece and out["ttft"] is None:
                out["ttft"] = time.time() - t0
        return out
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = repr(e)
        return out
    finally:
        c.close()


def vm_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def new_cluster(args, extra_cfg=""):
    return ct.Cluster(args, [{"tp": 1}, {"tp": 1}], extra_cfg=extra_cfg)


def finish(cl):
    ct.finish(cl)


def promtool(text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True,
                       timeout=60)
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace").strip()


def metric_value(text, name):
    """The value of the first series of `name` (labels or not)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


# ---------------------------------------------------------------- modes

def ensure_openai_client(args):
    """npm ci of tests/openai into BUILD_DIR/openai-client (once)."""
    src = os.path.join(HERE, "..", "openai")
    dst = os.path.join(args.build_dir, "openai-client")
    with open(os.path.join(src, "package.json")) as f:
        want = json.load(f)["dependencies"]["openai"]
    have = None
    try:
        with open(os.path.join(dst, "node_modules", "openai", "package.json")) as f:
            have = json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        pass
    if have != want:
        os.makedirs(dst, exist_ok=True)
        for n in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(src, n), os.path.join(dst, n))
        npm = shutil.which("npm")
        if not check(npm is not None, "npm is installed (Node 20 with npm)"):
            return None
        r = subprocess.run([npm, "ci", "--prefix", dst, "--no-audit", "--no-fund",
                            "--ignore-scripts"], capture_output=True, text=True, timeout=300)
        print(r.stdout[-2000:], r.stderr[-2000:])
        if not check(r.returncode == 0, "npm ci installed openai %s into %s" % (want, dst)):
            return None
    shutil.copy(os.path.join(src, "openai_client_test.mjs"), os.path.join(dst, "openai_client_test.mjs"))
    return dst


def mode_openai(args):
    client_dir = ensure_openai_client(args)
    if not client_dir:
        return
    node = shutil.which("node")
    check(node is not None, "node is installed")
    cl = new_cluster(args)
    try:
        cl.start()
        env = dict(os.environ, STRATA_BASE_URL="http://127.0.0.1:%d" % cl.http_port,
                   STRATA_MODEL="stories260K",
                   STRATA_REF=os.path.join(args.shared, "reference", "stories260K-greedy.json"))
        env.pop("NODE_OPTIONS", None)
        r = subprocess.run([node, os.path.join(client_dir, "openai_client_test.mjs")],
                           capture_output=True, text=True, timeout=300, env=env, cwd=client_dir)
        sys.stdout.write(r.stdout)
        sys.stdout.write(r.stderr)
        check(r.returncode == 0 and "all checks passed" in r.stdout,
              "the openai client's checks pass (exit %d)" % r.returncode)
        finish(cl)
    finally:
        if ct.FAILS:
            cl.dump_logs()
        cl.kill()


def mode_metrics(args):
    refs = load_ref(args)
    cl = new_cluster(args)
    try:
        cl.start()
        stop = threading.Event()
        results = []

        def client(i):
            while not stop.is_set():
                results.append(stream(cl, "/v1/completions", {
                    "prompt": refs[i % len(refs)]["prompt"], "max_tokens": 48,
                    "temperature": 0.8, "seed": i, "ignore_eos": True}))

        ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        texts = []
        try:
            time.sleep(1.5)
            for _ in range(3):
                st, body = request(cl, "GET", "/metrics")
                check(st == 200, "GET /metrics -> %d" % st)
                texts.append(body.decode())
                time.sleep(0.7)
        finally:
            stop.set()
            for t in ts:
                t.join(120)
        for i, text in enumerate(texts):
            rc, out = promtool(text)
            check(rc == 0, "promtool check metrics accepts scrape %d taken under load%s"
                  % (i, "" if rc == 0 else ": " + out[:800]))
        last = texts[-1]
        print("\n".join(l for l in last.splitlines()
                        if not l.startswith("#") and "_bucket" not in l))
        running = metric_value(texts[0], "strata_num_requests_running")
        check(running is not None and running > 0,
              "strata_num_requests_running %s > 0 while requests run" % running)
        gen = metric_value(last, "strata_generation_tokens_total")
        check(gen and gen > 0 and gen > metric_value(texts[0], "strata_generation_tokens_total"),
              "strata_generation_tokens_total grows (%s)" % gen)
        for name in ("strata_time_to_first_token_seconds_count",
                     "strata_time_per_output_token_seconds_count", "strata_prompt_tokens_total",
                     "strata_kv_blocks_used", "strata_kv_blocks_free"):
            v = metric_value(last, name)
            check(v is not None and (v > 0 or name == "strata_kv_blocks_used"),
                  "%s = %s" % (name, v))
        for s in ("0", "1"):
            check('strata_stage_frames_sent_total{stage="%s"}' % s in last and
                  'strata_stage_busy_ratio{stage="%s"}' % s in last,
                  "per-stage metrics for stage %s" % s)
        check('strata_worker_state{worker="w0",state="serving"} 1' in last and
              'strata_worker_heartbeat_age_seconds{worker="w1"}' in last,
              "per-worker state and heartbeat age")
        check('strata_requests_total{route="/v1/completions",status="200"}' in last,
              "requests by route and status")
        check(all(r["done"] and r["status"] == 200 for r in results),
              "%d streams during the scrapes all ended in [DONE]" % len(results))
        finish(cl)
    finally:
        if ct.FAILS:
            cl.dump_logs()
        cl.kill()


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def mode_load(args):
    refs = load_ref(args)
    seconds = float(os.environ.get("STRATA_LOAD_SECONDS", "60"))
    n_clients = int(os.environ.get("STRATA_LOAD_CLIENTS", "64"))
    warm = min(10.0, seconds / 4)
    cl = new_cluster(args, extra_cfg="max_seqs = 64\nmax_queue = 256")
    try:
        cl.start()
        pid = cl.coordinator.pid
        rss_start = vm_rss_kb(pid)
        lock = threading.Lock()
        stats = {"ok": 0, "fail": 0, "tokens": 0, "ttft": [], "errors": []}
        done = [0] * n_clients  # requests each client has finished
        t_end = [time.time() + 3600]  # set once the warm-up is over
        t_warm = time.time() + warm

        def client(i):
            k = 0
            while time.time() < t_end[0]:
                k += 1
                chat = (i + k) % 4 == 0
                r = refs[(i + k) % len(refs)]
                q = {"max_tokens": 32 + (i * 7 + k) % 33, "temperature": 0.7, "seed": i * 1000 + k,
                     "stream_options": {"include_usage": True}}
                if chat:
                    q["messages"] = [{"role": "user", "content": r["prompt"]}]
                else:
                    q["prompt"] = r["prompt"]
                res = stream(cl, "/v1/chat/completions" if chat else "/v1/completions", q)
                usage = next((c["usage"] for c in res["chunks"] if c.get("usage")), None)
                ok = res["status"] == 200 and res["done"] and not res["error"] and usage
                with lock:
                    done[i] += 1
                    if ok:
                        stats["ok"] += 1
                        stats["tokens"] += usage["completion_tokens"]
                        if res["ttft"] is not None and time.time() > t_warm:
                            stats["ttft"].append(res["ttft"])
                    else:
                        stats["fail"] += 1
                        if len(stats["errors"]) < 5:
                            stats["errors"].append((res["status"], res["done"], res["error"]))

        ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
        t0 = time.time()
        for t in ts:
            t.start()
        # The warm-up: a fixed time alone was not one on a loaded machine (CI,
        # load ~25 on 2 cores: many clients had not finished a request by
        # 10 s, and the RSS still rose with the first full round of streams).
        time.sleep(warm)
        t_cap = time.time() + 120
        while min(done) < 2 and time.time() < t_cap:
            time.sleep(0.2)
        warm_s = time.time() - t0
        warm_done = min(done)
        t_end[0] = max(t0 + seconds, time.time() + seconds / 2)
        rss_warm = vm_rss_kb(pid)
        scrape = None
        rss_peak = rss_warm
        series = []
        while time.time() < t_end[0]:
            time.sleep(1.0)
            series.append(vm_rss_kb(pid))
            rss_peak = max(rss_peak, series[-1])
            if scrape is None and time.time() > t0 + warm_s + 1:
                scrape = request(cl, "GET", "/metrics")[1].decode()
        rss_end = vm_rss_kb(pid)
        for t in ts:
            t.join(180)
        dt = time.time() - t0
        tps = stats["tokens"] / dt
        growth = (rss_end - rss_warm) / float(rss_warm)
        print("load: %d clients x %.0f s: %d requests ok, %d failed, %d tokens, %.1f tok/s, "
              "%.1f req/s" % (n_clients, seconds, stats["ok"], stats["fail"], stats["tokens"], tps,
                              stats["ok"] / dt))
        print("load: TTFT p50 %.1f ms, p99 %.1f ms (%d samples after the first %.0f s)"
              % (1e3 * pct(stats["ttft"], 50), 1e3 * pct(stats["ttft"], 99), len(stats["ttft"]),
                 warm))
        print("load: coordinator VmRSS start %d kB, after the %.1f s warm-up (every client %d+ requests) %d kB, "
              "peak %d kB, end %d kB (%+.2f%%)" % (rss_start, warm_s, warm_done, rss_warm, rss_peak, rss_end,
                                                  100 * growth))
        print("load: VmRSS each second after the warm-up (kB): %s" % " ".join(str(v) for v in series))
        check(stats["fail"] == 0, "zero failed requests (%s)" % stats["errors"])
        check(stats["ok"] >= n_clients, "%d requests completed" % stats["ok"])
        check(growth < 0.05, "coordinator RSS after warm-up grows %.2f%% < 5%%" % (100 * growth))
        if scrape:
            rc, out = promtool(scrape)
            check(rc == 0, "promtool accepts /metrics taken under load%s"
                  % ("" if rc == 0 else ": " + out[:600]))
        finish(cl)
    finally:
        if ct.FAILS:
            cl.dump_logs()
        cl.kill()


def error_shaped(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e.get("message"), str) and isinstance(e.get("type"), str) and \
            "param" in e and "code" in e
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def mode_unavailable(args):
    """No placement: a coordinator whose worker is not there yet answers 503."""
    port = ct.free_port()
    tmp = ct.tempfile.mkdtemp(prefix="strata-api-")
    path = os.path.join(tmp, "c.ini")
    with open(path, "w") as f:
        f.write("[cluster]\nmodel = %s\n[stage.0]\naddress = 127.0.0.1:%d\n" %
                (os.path.join(args.shared, "models", "stories260K.gguf"), port))
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp")
    env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (other tests may add bridges)
    hp = ct.free_port()
    p = subprocess.Popen([args.coordinator, "--config", path, "--listen", "127.0.0.1:%d" % hp,
                          "--ready-timeout", "30"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env)

    class Fake:
        http_port = hp
    try:
        st = None
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                st, body = request(Fake, "GET", "/health", timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        check(st == 503 and error_shaped(body), "no placement: /health -> %s" % st)
        for path_, obj in (("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
            st, body = request(Fake, "POST", path_, json.dumps(obj).encode())
            check(st == 503 and error_shaped(body), "no placement: POST %s -> %d %s"
                  % (path_, st, body[:120]))
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def mode_bad_input(args):
    mode_unavailable(args)
    ref = load_ref(args)[0]
    cl = new_cluster(args, extra_cfg="max_seqs = 1\nmax_queue = 1")
    try:
        cl.start()
        n_ctx = cl.stages_json()["n_ctx"]
        C, CH = "/v1/completions", "/v1/chat/completions"
        u = lambda s: s.encode()  # noqa: E731
        huge_prompt = json.dumps({"prompt": "Once upon a time. " * (n_ctx // 2)}).encode()
        ten_mb = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
        deep = b"[" * 100000 + b"]" * 100000
        table = [
            # (what, path, body, status, param)
            ("malformed JSON", C, b'{"prompt": "x", ', 400, None),
            ("empty body", C, b"", 400, None),
            ("a JSON list", C, b"[1, 2]", 400, None),
            ("a JSON string", C, b'"hello"', 400, None),
            ("JSON null", C, b"null", 400, None),
            ("nesting 100000 deep", C, deep, 400, None),
            ("missing prompt", C, b'{"max_tokens": 4}', 400, "prompt"),
            ("prompt a number", C, b'{"prompt": 12}', 400, "prompt"),
            ("prompt token id outside the vocabulary", C, b'{"prompt": [1, 2, 100000000]}', 400, "prompt"),
            ("prompt a mixed list", C, b'{"prompt": ["a", [1, 2]]}', 400, "prompt"),
            ("prompt with NUL", C, b'{"prompt": "a\\u0000b"}', 400, None),
            ("invalid UTF-8", C, b'{"prompt": "\xff\xfe"}', 400, None),
            ("a lone surrogate", C, b'{"prompt": "\\ud800"}', 400, None),
            ("max_tokens a string", C, b'{"prompt": "x", "max_tokens": "5"}', 400, "max_tokens"),
            ("max_tokens 0", C, b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
            ("max_tokens negative", C, b'{"prompt": "x", "max_tokens": -5}', 400, "max_tokens"),
            ("max_tokens 1e12", C, b'{"prompt": "x", "max_tokens": 1000000000000}', 400, "max_tokens"),
            ("max_tokens over the context", C, u('{"prompt": "x", "max_tokens": %d}' % (n_ctx + 1)), 400, "max_tokens"),
            ("max_tokens 1.5", C, b'{"prompt": "x", "max_tokens": 1.5}', 400, "max_tokens"),
            ("prompt longer than the context", C, huge_prompt, 400, "prompt"),
            ("temperature 3", C, b'{"prompt": "x", "temperature": 3}', 400, "temperature"),
            ("temperature a string", C, b'{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
            ("top_p -0.5", C, b'{"prompt": "x", "top_p": -0.5}', 400, "top_p"),
            ("top_p 1.5", C, b'{"prompt": "x", "top_p": 1.5}', 400, "top_p"),
            ("top_k a string", C, b'{"prompt": "x", "top_k": "a"}', 400, "top_k"),
            ("top_k -2", C, b'{"prompt": "x", "top_k": -2}', 400, "top_k"),
            ("min_p 2", C, b'{"prompt": "x", "min_p": 2}', 400, "min_p"),
            ("presence_penalty 5", C, b'{"prompt": "x", "presence_penalty": 5}', 400, "presence_penalty"),
            ("frequency_penalty -3", C, b'{"prompt": "x", "frequency_penalty": -3}', 400, "frequency_penalty"),
            ("seed 1.5", C, b'{"prompt": "x", "seed": 1.5}', 400, "seed"),
            ("n 0", C, b'{"prompt": "x", "n": 0}', 400, "n"),
            ("an unknown field", C, b'{"prompt": "x", "bogus_param": 1}', 400, "bogus_param"),
            ("best_of 3", C, b'{"prompt": "x", "best_of": 3}', 400, "best_of"),
            ("stop a number", C, b'{"prompt": "x", "stop": 7}', 400, "stop"),
            ("stop empty", C, b'{"prompt": "x", "stop": ""}', 400, "stop"),
            ("stop 5 entries", C, b'{"prompt": "x", "stop": ["a","b","c","d","e"]}', 400, "stop"),
            ("stop list with a number", C, b'{"prompt": "x", "stop": ["a", 1]}', 400, "stop"),
            ("logprobs 10", C, b'{"prompt": "x", "logprobs": 10}', 400, "logprobs"),
            ("logprobs true (chat style)", C, b'{"prompt": "x", "logprobs": true}', 400, "logprobs"),
            ("echo with logprobs", C, b'{"prompt": "x", "echo": true, "logprobs": 1}', 400, "echo"),
            ("stream a string", C, b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
            ("stream_options without stream", C, b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
            ("stream_options not an object", C, b'{"prompt": "x", "stream": true, "stream_options": 1}', 400, "stream_options"),
            ("user a number", C, b'{"prompt": "x", "user": 5}', 400, "user"),
            ("logit_bias over 100", C, b'{"prompt": "x", "logit_bias": {"5": 200}}', 400, "logit_bias"),
            ("unknown model", C, b'{"prompt": "x", "model": "gpt-4"}', 404, "model"),
            ("a 10 MB body", C, ten_mb, 413, None),
            ("chat: messages missing", CH, b'{"max_tokens": 4}', 400, "messages"),
            ("chat: messages empty", CH, b'{"messages": []}', 400, "messages"),
            ("chat: messages a string", CH, b'{"messages": "hi"}', 400, "messages"),
            ("chat: message a string", CH, b'{"messages": ["hi"]}', 400, "messages"),
            ("chat: unknown role tool", CH, b'{"messages": [{"role": "tool", "content": "x"}]}', 400, "messages"),
            ("chat: unknown role developer", CH, b'{"messages": [{"role": "developer", "content": "x"}]}', 400, "messages"),
            ("chat: role missing", CH, b'{"messages": [{"content": "x"}]}', 400, "messages"),
            ("chat: content a number", CH, b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages"),
            ("chat: content null", CH, b'{"messages": [{"role": "user", "content": null}]}', 400, "messages"),
            ("chat: image part", CH, b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400, "messages"),
            ("chat: logprobs an integer", CH, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 5}', 400, "logprobs"),
            ("chat: top_logprobs 30", CH, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 30}', 400, "top_logprobs"),
            ("chat: top_logprobs without logprobs", CH, b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400, "top_logprobs"),
            ("chat: max_completion_tokens 0", CH, b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}', 400, "max_completion_tokens"),
            ("chat: tools", CH, b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}', 400, "tools"),
            ("chat: n 500", CH, b'{"messages": [{"role": "user", "content": "x"}], "n": 500}', 400, "n"),
            ("chat: invalid UTF-8", CH, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, None),
            ("unknown route", "/v1/embeddings", b'{"input": "x"}', 404, None),
            ("GET on a POST route", ("GET", C), None, 405, None),
        ]
        n_ok = 0
        for what, path, body, status, param in table:
            method = "POST"
            if isinstance(path, tuple):
                method, path = path
            try:
                st, b = request(cl, method, path, body)
            except (OSError, http.client.HTTPException) as e:
                st, b = None, repr(e).encode()
            ok = st == status and error_shaped(b)
            if ok and param is not None:
                ok = json.loads(b)["error"]["param"] == param
            n_ok += ok
            check(ok, "%-36s -> %s %s" % (what, st, b[:160].decode(errors="replace").strip()))
        check(n_ok == len(table) and len(table) >= 30,
              "%d/%d malformed requests got their documented status and an OpenAI error body"
              % (n_ok, len(table)))
        for name, p in cl.procs:
            check(p.poll() is None, "%s still running after the bad input" % name)

        # 429: max_seqs 1 + max_queue 1: one runs, one waits, the next is refused.
        long_req = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                    "temperature": 0, "stream": True}
        socks = []
        for i in range(2):
            s = socket.create_connection(("127.0.0.1", cl.http_port), timeout=30)
            body = json.dumps(long_req).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            got = s.recv(4096)
            check(got.startswith(b"HTTP/1.1 200"), "long request %d accepted" % i)
            socks.append(s)
        st, b = request(cl, "POST", C, b'{"prompt": "x", "max_tokens": 4}')
        e = json.loads(b).get("error", {}) if error_shaped(b) else {}
        check(st == 429 and e.get("code") == "queue_full" and e.get("type") == "rate_limit_error",
              "queue full -> %d %s" % (st, b[:160]))
        for s in socks:
            s.close()
        deadline = time.time() + 20
        while time.time() < deadline and cl.stages_json()["requests_running"] > 0:
            time.sleep(0.1)

        # n = 3 over max_seqs 1 + max_queue 1: a choice is refused, so the whole
        # request is, and the choices already submitted are cancelled.
        st, b = request(cl, "POST", C, b'{"prompt": "x", "max_tokens": 4, "n": 3}')
        e = json.loads(b).get("error", {}) if error_shaped(b) else {}
        deadline = time.time() + 20
        left = None
        while time.time() < deadline:
            sj = cl.stages_json()
            left = sj["requests_running"] + sj["requests_waiting"]
            if left == 0:
                break
            time.sleep(0.05)
        check(st == 429 and e.get("code") == "queue_full" and left == 0,
              "n=3 beyond the queue -> %d %s; %s choices left in the engine" % (st, b[:120], left))

        st, b = post(cl, C, {"prompt": ref["prompt"], "max_tokens": 64, "temperature": 0,
                             "return_token_ids": True})
        check(st == 200 and b["choices"][0]["token_ids"] == ref["completion_tokens"],
              "after the bad input the next completion equals the reference")
        st, _ = request(cl, "GET", "/health")
        check(st == 200, "/health is still 200")
        _, m = request(cl, "GET", "/metrics")
        m = m.decode()
        check('strata_requests_total{route="/v1/completions",status="400"}' in m and
              'strata_requests_total{route="/v1/completions",status="413"}' in m and
              'strata_requests_total{route="/v1/completions",status="429"}' in m,
              "the refusals are counted by status in /metrics")

        def co_log():
            with open(cl.co_log) as f:
                return f.read()
        check(eventually(lambda: " req=cmpl-" in co_log() and "refused (400)" in co_log()),
              "the refusals are logged with their request id")
        finish(cl)
    finally:
        if ct.FAILS:
            cl.dump_logs()
        cl.kill()


# ---------------------------------------------------------------- issue 16: vLLM parity

def parity_checks(args, cl):
    """Issue 16's acceptance cases, each a row of (what, fn): fn returns
    (ok, detail). Real token ids from the llama.cpp reference throughout."""
    refs = load_ref(args)
    n_ctx = cl.stages_json()["n_ctx"]
    C, CH = "/v1/completions", "/v1/chat/completions"
    N = 16

    def greedy(prompt, **kw):
        q = dict(prompt=prompt, max_tokens=N, temperature=0, return_token_ids=True)
        q.update(kw)
        return post(cl, C, q)

    def ref_ids(r):
        return r["completion_tokens"][:N]

    def token_prompt_single():
        bad = []
        for r in refs[:3]:
            st, b = greedy(r["prompt_tokens"])
            ch = b["choices"][0] if st == 200 else {}
            if not (ch.get("token_ids") == ref_ids(r) and ch.get("prompt_token_ids") == r["prompt_tokens"]
                    and b["usage"]["prompt_tokens"] == len(r["prompt_tokens"])):
                bad.append((r["prompt"], st, b))
        return not bad, bad or "3 token-id prompts give the reference ids"

    def token_prompt_batch():
        rs = refs[:3]
        st, b = greedy([r["prompt_tokens"] for r in rs])
        if st != 200:
            return False, b
        ch = sorted(b["choices"], key=lambda c: c["index"])
        ok = [c["index"] for c in ch] == [0, 1, 2] and all(
            c["token_ids"] == ref_ids(r) for c, r in zip(ch, rs))
        ok = ok and b["usage"]["prompt_tokens"] == sum(len(r["prompt_tokens"]) for r in rs) and \
            b["usage"]["completion_tokens"] == 3 * N
        st2, b2 = greedy([r["prompt"] for r in rs])
        ch2 = sorted(b2["choices"], key=lambda c: c["index"]) if st2 == 200 else []
        ok = ok and [c["token_ids"] for c in ch2] == [c["token_ids"] for c in ch] and \
            [c["text"] for c in ch2] == [c["text"] for c in ch]
        return ok, "batch of 3 id prompts == batch of 3 texts == reference; usage %s" % b["usage"]

    def token_prompt_out_of_vocab():
        st, b = post(cl, C, {"prompt": [1, 10 ** 6], "max_tokens": 2})
        e = b.get("error", {})
        return st == 400 and e.get("param") == "prompt" and "vocabulary" in e.get("message", ""), b

    sample = dict(prompt=refs[1]["prompt"], max_tokens=N, temperature=1.0, return_token_ids=True)

    def n3_seeded():
        st, a = post(cl, C, dict(sample, n=3, seed=7))
        st2, b = post(cl, C, dict(sample, n=3, seed=7))
        st3, c = post(cl, C, dict(sample, n=3, seed=8))
        if (st, st2, st3) != (200, 200, 200):
            return False, (a, b, c)
        ids = lambda x: [ch["token_ids"] for ch in sorted(x["choices"], key=lambda ch: ch["index"])]  # noqa: E731
        ok = sorted(ch["index"] for ch in a["choices"]) == [0, 1, 2]
        ok = ok and ids(a) == ids(b) and ids(a) != ids(c) and len(set(map(tuple, ids(a)))) > 1
        ok = ok and a["usage"]["completion_tokens"] == sum(len(x) for x in ids(a))
        # choice i samples with seed + i (docs/api.md): n=1 with seed 9 == choice 2 of seed 7
        _, one = post(cl, C, dict(sample, seed=9))
        ok = ok and one["choices"][0]["token_ids"] == ids(a)[2]
        return ok, "n=3 seed 7: %s; seed 8 differs; choice 2 == seed 9" % [len(x) for x in ids(a)]

    def n2_stream():
        res = stream(cl, C, dict(sample, n=2, seed=11, stream_options={"include_usage": True}))
        per = {}
        for ch in res["chunks"]:
            for x in ch.get("choices", []):
                per.setdefault(x["index"], []).extend(x.get("token_ids") or [])
        usage = next((ch["usage"] for ch in res["chunks"] if ch.get("usage")), None)
        _, whole = post(cl, C, dict(sample, n=2, seed=11))
        want = {ch["index"]: ch["token_ids"] for ch in whole["choices"]}
        ok = res["done"] and per == want and usage and \
            usage["completion_tokens"] == sum(len(v) for v in per.values())
        return ok, "streamed n=2 per index == non-streaming (%s)" % sorted(per)

    def chat_n2():
        q = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 8,
             "temperature": 1, "seed": 3, "n": 2}
        st, b = post(cl, CH, q)
        res = stream(cl, CH, q)
        idx = sorted({x["index"] for ch in res["chunks"] for x in ch.get("choices", [])})
        roles = [x["index"] for ch in res["chunks"] for x in ch.get("choices", [])
                 if x.get("delta", {}).get("role") == "assistant"]
        return st == 200 and sorted(c["index"] for c in b["choices"]) == [0, 1] and idx == [0, 1] \
            and sorted(roles) == [0, 1], "chat n=2: two choices, both streamed with a role chunk"

    def top_p_zero():
        bad = []
        for r in refs[:2]:
            st, b = post(cl, C, dict(prompt=r["prompt"], max_tokens=N, temperature=1.0, top_p=0,
                                     seed=5, return_token_ids=True))
            if st != 200 or b["choices"][0]["token_ids"] != ref_ids(r):
                bad.append((st, b))
        return not bad, bad or "top_p 0 at temperature 1 == the greedy reference"

    def unknown_field():
        st, b = post(cl, C, {"prompt": "x", "max_tokens": 2, "bogus_param": 1})
        e = b.get("error", {})
        ok = st == 400 and e.get("param") == "bogus_param" and \
            e.get("message") == "Unrecognized request argument supplied: bogus_param"
        st2, b2 = post(cl, C, {"prompt": "x", "max_tokens": 2, "user": "u", "store": False,
                               "metadata": {"k": "v"}, "stream": False})
        return ok and st2 == 200, "unknown -> %d %s; known harmless fields -> %d" % (st, e, st2)

    def chat_injection():
        msgs = [{"role": "user", "content": "<s></s>hi"}]
        st, t = post(cl, "/tokenize", {"messages": msgs})
        if st != 200:
            return False, t
        ids = t["tokens"]
        _, c = post(cl, CH, {"messages": msgs, "max_tokens": 2, "temperature": 0})
        _, plain = post(cl, "/tokenize", {"prompt": "User: <s></s>hi\nAssistant:"})
        ok = ids[0] == 1 and 1 not in ids[1:] and 2 not in ids and \
            c["usage"]["prompt_tokens"] == t["count"] == len(ids) and ids == plain["tokens"]
        return ok, "chat <s></s>hi -> %s (= the plain text's ids, no control ids)" % ids

    def tokenize_roundtrip():
        bad = []
        for r in refs:
            st, t = post(cl, "/tokenize", {"prompt": r["prompt"]})
            st2, d = post(cl, "/detokenize", {"tokens": r["prompt_tokens"]})
            if not (st == 200 and t["tokens"] == r["prompt_tokens"] and
                    t["count"] == len(r["prompt_tokens"]) and t["max_model_len"] == n_ctx and
                    st2 == 200 and d["prompt"] == r["prompt"]):
                bad.append((r["prompt"], t, d))
        st, t = post(cl, "/tokenize", {"prompt": refs[0]["prompt"], "add_special_tokens": False})
        ok = st == 200 and t["tokens"] == refs[0]["prompt_tokens"][1:] and t["token_strs"] is None
        st, t = post(cl, "/tokenize", {"prompt": "Once upon", "return_token_strs": True})
        ok = ok and st == 200 and t["token_strs"][0] == "<s>" and \
            "".join(t["token_strs"][1:]).replace("\u2581", " ") == " Once upon"
        return not bad and ok, bad or "%d reference prompts round-trip" % len(refs)

    def tokenize_bad():
        rows = [("/tokenize", b'{"prompt": 5}', "prompt"), ("/tokenize", b"{}", "prompt"),
                ("/tokenize", b'{"prompt": "x", "bogus": 1}', "bogus"),
                ("/tokenize", b'{"prompt": "x", "messages": []}', "prompt"),
                ("/tokenize", b'{"messages": [{"role": "tool", "content": "x"}]}', "messages"),
                ("/detokenize", b'{"tokens": [1, -1]}', "tokens"),
                ("/detokenize", b'{"tokens": [100000000]}', "tokens"),
                ("/detokenize", b'{"tokens": "1 2"}', "tokens"), ("/detokenize", b"[1]", None),
                ("/tokenize", b'{"prompt": "x", "model": "gpt-4"}', "model")]
        bad = []
        for path, body, param in rows:
            st, b = request(cl, "POST", path, body)
            want = 404 if param == "model" else 400
            if not (st == want and error_shaped(b) and json.loads(b)["error"]["param"] == param):
                bad.append((path, body, st, b[:200]))
        st, _ = request(cl, "GET", "/tokenize")
        return not bad and st == 405, bad or "%d bad tokenizer requests -> 400/404 with param" % len(rows)

    def repetition_penalty():
        r = refs[0]
        st, same = greedy(r["prompt"], repetition_penalty=1.0)
        st2, b = greedy(r["prompt"], repetition_penalty=100)
        ids = b["choices"][0]["token_ids"] if st2 == 200 else []
        seen = set(r["prompt_tokens"])
        fresh = all(t not in seen and t not in ids[:i] for i, t in enumerate(ids))
        ok = st == 200 and same["choices"][0]["token_ids"] == ref_ids(r) and len(ids) == N and \
            fresh and ids != ref_ids(r) and len(set(ref_ids(r)) & seen) > 0
        return ok, "1.0 == reference; 100 -> %s (no prompt id, no repeat; the reference repeats)" % ids

    def logit_bias():
        r = refs[0]
        first = ref_ids(r)[0]
        st, a = greedy(r["prompt"], logit_bias={str(first): -100})
        st2, b = greedy(r["prompt"], logit_bias={"300": 100}, max_tokens=8)
        ok = st == 200 and a["choices"][0]["token_ids"][0] != first and \
            st2 == 200 and b["choices"][0]["token_ids"] == [300] * 8
        return ok, "-100 on %d moves the first token to %s; +100 on 300 -> %s" % (
            first, a["choices"][0]["token_ids"][:1], b["choices"][0]["token_ids"])

    def min_tokens():
        r = refs[0]
        eos = {"2": 100}
        st, a = greedy(r["prompt"], logit_bias=eos)
        st2, b = greedy(r["prompt"], logit_bias=eos, min_tokens=5)
        ok = st == 200 and a["usage"]["completion_tokens"] == 0 and \
            a["choices"][0]["finish_reason"] == "stop" and st2 == 200 and \
            b["usage"]["completion_tokens"] == 5 and b["choices"][0]["finish_reason"] == "stop" and \
            2 not in b["choices"][0]["token_ids"]
        return ok, "EOS at +100: %d tokens; with min_tokens 5: %s" % (
            a["usage"]["completion_tokens"], b["choices"][0]["token_ids"])

    def stop_token_ids():
        r = refs[1]
        ids = ref_ids(r)
        stop_id = ids[5]
        k = ids.index(stop_id)
        st, a = greedy(r["prompt"], stop_token_ids=[stop_id])
        _, b = greedy(r["prompt"], max_tokens=k)
        ch = a["choices"][0]
        ok = st == 200 and ch["finish_reason"] == "stop" and ch["token_ids"] == ids[:k + 1] and \
            ch["text"] == b["choices"][0]["text"] and a["usage"]["completion_tokens"] == k + 1
        return ok, "stop at id %d: %s, text %r" % (stop_id, ch["token_ids"], ch["text"])

    def skip_special_tokens():
        q = dict(logit_bias={"2": 100}, ignore_eos=True, max_tokens=3)
        st, a = greedy(refs[0]["prompt"], **q)
        st2, b = greedy(refs[0]["prompt"], skip_special_tokens=False, **q)
        ok = st == 200 and a["choices"][0]["text"] == "" and a["choices"][0]["token_ids"] == [2] * 3 \
            and st2 == 200 and b["choices"][0]["text"] == "</s></s></s>"
        return ok, "EOS x3: default %r, skip_special_tokens false %r" % (
            a["choices"][0]["text"], b["choices"][0]["text"])

    def n4_disconnect():
        """A client that leaves a stream of 4 choices cancels all 4."""
        s = socket.create_connection(("127.0.0.1", cl.http_port), timeout=30)
        try:
            body = json.dumps({"prompt": refs[0]["prompt"], "max_tokens": 400, "ignore_eos": True,
                               "n": 4, "seed": 1, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while got.count(b'"index"') < 4:
                got += s.recv(65536)
            sj = cl.stages_json()
            running = sj["requests_running"] + sj["requests_waiting"]
        finally:
            s.close()
        deadline = time.time() + 20
        left = None
        while time.time() < deadline:
            sj = cl.stages_json()
            left = sj["requests_running"] + sj["requests_waiting"]
            if left == 0:
                break
            time.sleep(0.05)
        return running == 4 and left == 0, "4 choices in the engine (%s), 0 after the client left (%s)" % (
            running, left)

    def one_choice_stops():
        """A stop in one choice ends only that choice; the others run on."""
        a, b = refs[1], refs[2]
        sid = next(t for t in ref_ids(a)[2:] if t not in ref_ids(b))
        k = ref_ids(a).index(sid)
        q = dict(prompt=[a["prompt"], b["prompt"]], stop_token_ids=[sid])
        st, whole = greedy(**q)
        res = stream(cl, C, dict(q, max_tokens=N, temperature=0, return_token_ids=True))
        per, fin = {}, {}
        for ch in res["chunks"]:
            for x in ch.get("choices", []):
                per.setdefault(x["index"], []).extend(x.get("token_ids") or [])
                if x.get("finish_reason"):
                    fin[x["index"]] = x["finish_reason"]
        c = sorted(whole["choices"], key=lambda x: x["index"]) if st == 200 else []
        want = {0: ref_ids(a)[:k + 1], 1: ref_ids(b)}
        ok = len(c) == 2 and c[0]["token_ids"] == want[0] and c[0]["finish_reason"] == "stop" and \
            c[1]["token_ids"] == want[1] and c[1]["finish_reason"] == "length" and \
            per == want and fin == {0: "stop", 1: "length"} and res["done"]
        return ok, "stop id %d: choice 0 stops after %d tokens, choice 1 runs %d (stream too)" % (
            sid, k + 1, N)

    return [
        ("a stop in one choice ends only that choice", one_choice_stops),
        ("a client that leaves cancels every choice", n4_disconnect),
        ("repetition_penalty changes the output where it must", repetition_penalty),
        ("logit_bias moves and forces tokens", logit_bias),
        ("min_tokens holds EOS back", min_tokens),
        ("stop_token_ids end the choice", stop_token_ids),
        ("skip_special_tokens false shows control tokens", skip_special_tokens),
        ("token-id prompt equals the reference", token_prompt_single),
        ("batched id prompts == batched texts == reference", token_prompt_batch),
        ("token id outside the vocabulary -> 400", token_prompt_out_of_vocab),
        ("n=3 with a seed: indices 0-2, deterministic per seed", n3_seeded),
        ("n=2 streaming: chunks per index", n2_stream),
        ("chat n=2", chat_n2),
        ("top_p 0 is greedy", top_p_zero),
        ("unknown field follows the documented rule", unknown_field),
        ("chat content cannot inject control tokens", chat_injection),
        ("/tokenize and /detokenize round-trip the reference", tokenize_roundtrip),
        ("/tokenize and /detokenize refuse bad input", tokenize_bad),
    ]


def mode_parity(args):
    cl = new_cluster(args)
    try:
        cl.start()
        for what, fn in parity_checks(args, cl):
            try:
                ok, detail = fn()
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError,
                    IndexError) as e:
                ok, detail = False, repr(e)
            check(ok, "%s: %s" % (what, str(detail)[:600]))
        for name, p in cl.procs:
            check(p.poll() is None, "%s still running" % name)
        finish(cl)
    finally:
        if ct.FAILS:
            cl.dump_logs()
        cl.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "../shared"))
    ap.add_argument("--build-dir", default=os.environ.get("TMPDIR", "/tmp"))
    args = ap.parse_args()
    modes = {"openai": mode_openai, "metrics": mode_metrics, "load": mode_load,
             "bad-input": mode_bad_input, "parity": mode_parity}
    if args.mode not in modes:
        print("unknown mode", args.mode)
        return 2
    modes[args.mode](args)
    if ct.FAILS:
        print("%d check(s) failed" % len(ct.FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
