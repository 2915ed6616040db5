#!/usr/bin/python3
"""obs_test.py — issue 17's observability checks on a real PP 2 cluster
(strata-coordinator + 2 strata-worker processes on stories260K, started and
always stopped by the test; tests/cluster/cluster_test.py's Cluster).

  obs_test.py MODE --coordinator BIN --worker BIN --shared DIR

MODE
  logs       every stderr line of the coordinator and the workers is logfmt
             (ts= level= tag=strata-coordinator|strata-worker ... msg=); one
             access line per HTTP request (method, route, status, bytes =
             the body bytes the client read, duration_ms, req = the response
             id), for a plain and a streamed completion, a probe, a scrape
             and an unknown path; worker lines carry the request id; with
             --log-level warn no info line is written; a bad --log-level
             exits 2
  routes     strata_requests_total{route,status} counts API requests by a
             fixed route set (an unknown path is "other"); probes and
             /metrics scrapes count only in strata_ops_requests_total
  requests   vLLM's per-request metrics after 8 completions (plain, stream,
             chat, n=2) and 1 abandoned stream: every histogram count is the
             number of finished requests, the token histograms' sums equal
             the usage the client got, success_total by finished_reason
             matches the finish reasons (abort counted apart), per-stage
             forward/hop/load, epoch, KV usage, process_* and build info
  worker     each worker's --metrics-listen /metrics: forward and hop
             histograms agree with the work done, bytes/frames counters,
             KV, stage info, process_*; 404/405 on other paths and methods;
             a non-loopback --metrics-listen is refused without
             --metrics-insecure
  promtool   `promtool check metrics` on the coordinator's and a worker's
             /metrics after traffic (exit 77 when promtool is missing)
  grafana    deploy/grafana/strata.json parses as a Grafana dashboard (unique
             panel ids, grid positions, a query per target, its variables
             defined) and every metric it queries, with every label it
             matches or groups by, exists in the /metrics of the coordinator
             or a worker

Every scrape also passes check_exposition(): this file's own check of the
text format 0.0.4 (families declared once, before their samples; names and
labels; counters end in _total; cumulative buckets; +Inf == _count), so
the format is checked even where promtool is absent.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_test as ct  # noqa: E402  (Cluster, finish)
from harness import FAILS, check, sse_events  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "api"))
from api_test import request  # noqa: E402  (one HTTP helper for the API tests)

# ---------------------------------------------------------------- logfmt

_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^\s"=]*)(?: +|$)')
_ESC = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def parse_logfmt(line):
    """key=value pairs of one line (dict, in order), or None when the line is
    not logfmt."""
    out, pos = {}, 0
    while pos < len(line):
        m = _PAIR.match(line, pos)
        if not m or m.end() == pos:
            return None
        k, v = m.group(1), m.group(2)
        if v.startswith('"'):
            v = re.sub(r'\\(x[0-9a-f]{2}|.)',
                       lambda e: chr(int(e.group(1)[1:], 16)) if e.group(1)[0] == "x"
                       else _ESC.get(e.group(1), e.group(1)), v[1:-1])
        out[k] = v
        pos = m.end()
    return out


def log_records(path, tag):
    """The log records of a process's output file: (records, bad lines).
    Lines that are not log records (the daemons' stdout banners, sanitizer
    output) are skipped; a line that starts like one must parse."""
    recs, bad = [], []
    with open(path, errors="replace") as f:
        for line in f.read().splitlines():
            if not line.startswith("ts="):
                continue
            r = parse_logfmt(line)
            if (r is None or list(r)[:3] != ["ts", "level", "tag"] or r["tag"] != tag or
                    r["level"] not in ("error", "warn", "info", "debug") or "msg" not in r or
                    not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", r["ts"])):
                bad.append(line)
            else:
                recs.append(r)
    return recs, bad


# ---------------------------------------------------------------- HTTP



def metrics_text(cl):
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        body = r.read().decode()
        check(r.status == 200 and r.getheader("Content-Type") ==
              "text/plain; version=0.0.4; charset=utf-8",
              "GET /metrics -> %d %s" % (r.status, r.getheader("Content-Type")))
    finally:
        c.close()
    check_exposition(body, "coordinator /metrics")
    return body


def worker_metrics(port, path="/metrics", method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode(errors="replace")
    finally:
        c.close()


def worker_metrics_ports(cl):
    """The --metrics-listen ports the workers printed ("strata-worker: metrics on H:P")."""
    ports = []
    for i in range(len(cl.stages)):
        path = os.path.join(cl.tmp, "worker%d.log" % i)
        deadline = time.time() + 20
        port = None
        while port is None and time.time() < deadline:
            with open(path, errors="replace") as f:
                m = re.search(r"^strata-worker: metrics on [^\n]*:(\d+)$", f.read(), re.M)
            port = int(m.group(1)) if m else None
            if port is None:
                time.sleep(0.05)
        ports.append(port)
    return ports


def samples(text):
    """{(name, frozenset(labels.items())): value} of a text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return out


def value(s, name, **labels):
    return s.get((name, frozenset(labels.items())), 0.0)


_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def check_exposition(text, what):
    """A check that text is valid Prometheus text format 0.0.4."""
    problems = exposition_problems(text)
    check(not problems, "%s: the exposition is valid text format 0.0.4%s"
          % (what, "" if not problems else ": " + "; ".join(problems[:5])))
    return len(problems)


def exposition_problems(text):
    """What is wrong with text as Prometheus text format 0.0.4, the way
    promtool's linter and the Prometheus parser read it (a list of reasons)."""
    problems = []
    types, helps, seen, order = {}, set(), set(), []
    hist = {}  # (family, labels without le) -> {"buckets": [(le, v)], "count": v}
    for n, line in enumerate(text.split("\n"), 1):
        if line == "":
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if len(parts) < 4 or not _NAME.match(parts[2]):
                problems.append("line %d: bad comment %r" % (n, line))
                continue
            fam = parts[2]
            if line.startswith("# TYPE "):
                if fam in types or parts[3] not in ("counter", "gauge", "histogram", "summary",
                                                     "untyped"):
                    problems.append("line %d: TYPE twice or unknown: %r" % (n, line))
                types[fam] = parts[3]
                if parts[3] == "counter" and not fam.endswith("_total"):
                    problems.append("line %d: counter %s does not end in _total" % (n, fam))
                if fam in order:
                    problems.append("line %d: %s's samples came before its TYPE" % (n, fam))
            else:
                if fam in helps:
                    problems.append("line %d: HELP twice for %s" % (n, fam))
                helps.add(fam)
            continue
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)$", line)
        if not m:
            problems.append("line %d: not a sample: %r" % (n, line))
            continue
        name, body, val = m.group(1), m.group(3) or "", m.group(4)
        labels, pos = [], 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                problems.append("line %d: bad labels %r" % (n, body))
                break
            labels.append((lm.group(1), lm.group(2)))
            pos = lm.end()
        if len(set(k for k, _ in labels)) != len(labels) or any(k.startswith("__") for k, _ in labels):
            problems.append("line %d: duplicate or reserved label" % n)
        try:
            v = float(val)
        except ValueError:
            problems.append("line %d: bad value %r" % (n, val))
            continue
        fam = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and types.get(name[:-len(suf)]) == "histogram":
                fam = name[:-len(suf)]
        if fam not in types:
            problems.append("line %d: sample of %s before (or without) its TYPE" % (n, name))
        if not order or order[-1] != fam:
            if fam in order:
                problems.append("line %d: %s's samples are not together" % (n, fam))
            order.append(fam)
        key = (name, tuple(labels))
        if key in seen:
            problems.append("line %d: series twice: %s" % (n, line))
        seen.add(key)
        if types.get(fam) == "counter" and v < 0:
            problems.append("line %d: negative counter" % n)
        if types.get(fam) == "histogram":
            rest = tuple((k, x) for k, x in labels if k != "le")
            h = hist.setdefault((fam, rest), {"buckets": [], "count": None})
            if name.endswith("_bucket"):
                le = dict(labels).get("le")
                if le is None:
                    problems.append("line %d: bucket without le" % n)
                else:
                    h["buckets"].append((float(le), v))
            elif name.endswith("_count"):
                h["count"] = v
    for (fam, rest), h in hist.items():
        les = [le for le, _ in h["buckets"]]
        vals = [v for _, v in h["buckets"]]
        if not les or les[-1] != float("inf") or les != sorted(les) or vals != sorted(vals) or \
                h["count"] != vals[-1]:
            problems.append("histogram %s%s: buckets %s, count %s" % (fam, dict(rest), h["buckets"][-3:],
                                                                     h["count"]))
    return problems


def exposition_selftest():
    """check_exposition finds what promtool would (so that it can fail)."""
    good = ('# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 2\n'
            '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n')
    check(exposition_problems(good) == [], "the exposition check accepts valid text")
    bad = {
        "a counter without _total": "# TYPE a counter\na 1\n",
        "a sample before its TYPE": "a_total 1\n# TYPE a_total counter\n",
        "non-cumulative buckets": '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
        "+Inf != _count": '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n',
        "a series twice": "# TYPE g gauge\ng 1\ng 2\n",
        "a bad label value": '# TYPE g gauge\ng{x="a"b"} 1\n',
        "a bad value": "# TYPE g gauge\ng one\n",
        "families interleaved": "# TYPE g gauge\n# TYPE f gauge\ng{a=\"1\"} 1\nf 1\ng{a=\"2\"} 1\n",
    }
    for what, text in bad.items():
        p = exposition_problems(text)
        check(p, "the exposition check rejects %s: %s" % (what, "; ".join(p[:2])))


def wait_log(path, pred, skip=0, timeout=10):
    """The coordinator's records after the first `skip`, once pred holds."""
    deadline = time.time() + timeout
    while True:
        recs = log_records(path, "strata-coordinator")[0][skip:]
        if pred(recs) or time.time() > deadline:
            return recs
        time.sleep(0.05)


def new_cluster(args, coord_args=(), worker_metrics=False):
    extra = ["--metrics-listen", "127.0.0.1:0"] if worker_metrics else []
    return ct.Cluster(args, [{"tp": 1, "args": extra}, {"tp": 1, "args": extra}],
                      coord_args=list(coord_args))


def completion(cl, path, obj):
    """POST; returns (status, body dict, finish reasons, usage). Streams are
    read to [DONE] with include_usage."""
    if not obj.get("stream"):
        st, b = request(cl, "POST", path, json.dumps(obj).encode())
        j = json.loads(b)
        return st, j, [ch["finish_reason"] for ch in j.get("choices", [])], j.get("usage")
    obj = dict(obj, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
    try:
        c.request("POST", path, body=json.dumps(obj).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        fin, usage, last = {}, None, None
        for j in sse_events(r):
            if j is None:
                break
            last = j
            for ch in j.get("choices") or []:
                if ch.get("finish_reason"):
                    fin[ch.get("index", 0)] = ch["finish_reason"]
            if j.get("usage"):
                usage = j["usage"]
        return r.status, last, [fin[k] for k in sorted(fin)], usage
    finally:
        c.close()


# ---------------------------------------------------------------- modes

def mode_logs(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        ref = json.load(f)[0]
    # A bad --log-level is refused before anything starts.
    r = subprocess.run([args.coordinator, "--config", "/nonexistent", "--log-level", "loud"],
                       capture_output=True, timeout=30)
    check(r.returncode == 2 and b"--log-level" in r.stderr,
          "coordinator --log-level loud -> exit %d %s" % (r.returncode, r.stderr[:200]))
    r = subprocess.run([args.worker, "--listen", "127.0.0.1:0", "--log-level", "loud"],
                       capture_output=True, timeout=30)
    check(r.returncode == 2 and b"--log-level" in r.stderr,
          "worker --log-level loud -> exit %d %s" % (r.returncode, r.stderr[:200]))

    cl = new_cluster(args)
    try:
        cl.start()
        # A marker: the loop answers it after start()'s probes are logged.
        check(request(cl, "GET", "/v1/models")[0] == 200, "/v1/models")
        recs = wait_log(cl.co_log, lambda rs: any(r.get("route") == "/v1/models" for r in rs))
        skip = [i for i, r in enumerate(recs) if r.get("route") == "/v1/models"][-1] + 1
        # 1. A plain completion: its access line.
        st, body = request(cl, "POST", "/v1/completions", json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 16, "temperature": 0}).encode())
        check(st == 200, "completion -> %d" % st)
        rid = json.loads(body)["id"]
        # 2. A streamed one: bytes = what the client read (chunks decoded).
        c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "stream": True,
             "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        sbody = resp.read()
        c.close()
        sid = json.loads(sbody.split(b"\n")[0][len(b"data: "):])["id"]
        check(resp.status == 200 and sbody.endswith(b"data: [DONE]\n\n"),
              "stream -> %d, ends with [DONE]" % resp.status)
        # 3. A probe, a scrape, an unknown path, a wrong method.
        check(request(cl, "GET", "/health")[0] == 200, "/health 200")
        check(request(cl, "GET", "/metrics")[0] == 200, "/metrics 200")
        st_nf, b_nf = request(cl, "GET", "/no/such/path?x=1")
        check(st_nf == 404, "unknown path -> 404")
        st_405, b_405 = request(cl, "GET", "/v1/completions")
        check(st_405 == 405, "GET /v1/completions -> 405")

        recs = wait_log(cl.co_log, lambda rs: sum(r["msg"] == "access" for r in rs) >= 6, skip)
        acc = [r for r in recs if r["msg"] == "access"]
        check(len(acc) == 6, "6 access lines for 6 requests (got %d)" % len(acc))

        def one(pred, what):
            m = [r for r in acc if pred(r)]
            check(len(m) == 1, "one access line for %s (got %d: %s)" % (what, len(m), m))
            return m[0] if m else {}

        a = one(lambda r: r.get("req") == rid, "the completion " + rid)
        check(a.get("method") == "POST" and a.get("route") == "/v1/completions" and
              a.get("status") == "200" and a.get("bytes") == str(len(body)) and
              float(a.get("duration_ms", "-1")) > 0,
              "completion access line: %s (body %d bytes)" % (a, len(body)))
        a = one(lambda r: r.get("req") == sid, "the stream " + sid)
        check(a.get("method") == "POST" and a.get("route") == "/v1/chat/completions" and
              a.get("status") == "200" and a.get("bytes") == str(len(sbody)) and
              "aborted" not in a, "stream access line: %s (body %d bytes)" % (a, len(sbody)))
        a = one(lambda r: r.get("route") == "/health", "/health")
        check(a.get("method") == "GET" and a.get("status") == "200" and "req" not in a,
              "probe access line: %s" % a)
        one(lambda r: r.get("route") == "/metrics" and r.get("status") == "200", "/metrics")
        a = one(lambda r: r.get("route") == "other", "the unknown path")
        check(a.get("status") == "404" and a.get("bytes") == str(len(b_nf)),
              "unknown path access line: %s" % a)
        a = one(lambda r: r.get("status") == "405", "the 405")
        check(a.get("route") == "/v1/completions" and a.get("method") == "GET",
              "405 access line: %s" % a)
        fin = [r for r in recs if r["msg"] == "finished" and r.get("req") == rid]
        check(len(fin) == 1 and fin[0].get("completion_tokens") == "16" and
              fin[0].get("finish") == "length",
              "the finished line carries the id and the counts: %s" % fin)

        # A client that goes away mid-stream: aborted=1, status 200.
        s = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
        s.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 400, "ignore_eos": True,
             "stream": True}).encode(), headers={"Content-Type": "application/json"})
        r = s.getresponse()
        first = next(sse_events(r))
        aid = first["id"]
        s.sock.close()
        s.close()
        recs = wait_log(cl.co_log, lambda rs: any(x["msg"] == "access" and x.get("req") == aid
                                                  for x in rs))
        a = [x for x in recs if x["msg"] == "access" and x.get("req") == aid]
        check(len(a) == 1 and a[0].get("aborted") == "1" and a[0].get("status") == "200" and
              int(a[0].get("bytes", "0")) > 0, "disconnected stream: %s" % a)

        ct.finish(cl)
        # Every line of every process is logfmt with its program's tag.
        recs, bad = log_records(cl.co_log, "strata-coordinator")
        check(not bad and len(recs) > 10, "coordinator: %d logfmt records, bad lines: %s"
              % (len(recs), bad[:3]))
        for i in range(2):
            wrecs, wbad = log_records(os.path.join(cl.tmp, "worker%d.log" % i), "strata-worker")
            check(not wbad and wrecs and all(r.get("node") == "w%d" % i for r in wrecs),
                  "worker %d: %d logfmt records with node=w%d, bad lines: %s"
                  % (i, len(wrecs), i, wbad[:3]))
            starts = [r for r in wrecs if r["msg"] == "seq starts"]
            check(any(r.get("req") == rid for r in starts) and
                  all(r.get("req") and r.get("batch") and r.get("seq") for r in starts),
                  "worker %d: 'seq starts' lines carry req, seq and batch (%d)" % (i, len(starts)))
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()

    # --log-level warn: no info record at all, so no access lines either.
    cl = new_cluster(args, ["--log-level", "warn"])
    try:
        cl.start()
        st, _ = request(cl, "POST", "/v1/completions", json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 4}).encode())
        check(st == 200, "completion at --log-level warn -> %d" % st)
        ct.finish(cl)
        recs, bad = log_records(cl.co_log, "strata-coordinator")
        check(not bad and all(r["level"] in ("warn", "error") for r in recs),
              "--log-level warn: only warn/error records (%d records: %s)"
              % (len(recs), sorted(set(r["level"] for r in recs))))
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_routes(args):
    exposition_selftest()
    cl = new_cluster(args)
    try:
        cl.start()
        before = samples(metrics_text(cl))
        for _ in range(3):
            check(request(cl, "GET", "/health")[0] == 200, "/health")
        for _ in range(2):
            metrics_text(cl)
        check(request(cl, "GET", "/v1/models")[0] == 200, "/v1/models")
        check(request(cl, "GET", "/nope/%2e%2e/x")[0] == 404, "unknown path")
        check(request(cl, "POST", "/v1/completions", b"{")[0] == 400, "bad body")
        after = samples(metrics_text(cl))

        def delta(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        check(delta("strata_requests_total", route="/v1/models", status="200") == 1,
              "one /v1/models request counted")
        check(delta("strata_requests_total", route="other", status="404") == 1,
              "the unknown path counted as route=other")
        check(delta("strata_requests_total", route="/v1/completions", status="400") == 1,
              "the bad body counted under /v1/completions 400")
        check(delta("strata_ops_requests_total", route="/health", status="200") == 3,
              "3 probes in strata_ops_requests_total")
        # The scrape before `after` and the 2 between; `after` itself is counted
        # when its answer is complete.
        check(delta("strata_ops_requests_total", route="/metrics", status="200") == 3,
              "3 scrapes in strata_ops_requests_total (%s)"
              % delta("strata_ops_requests_total", route="/metrics", status="200"))
        routes = set(dict(k[1]).get("route") for k in after if k[0] == "strata_requests_total")
        check(not (routes & {"/health", "/metrics", "/nope/%2e%2e/x", "/nope/../x"}),
              "no probe, scrape or raw path in strata_requests_total routes: %s" % sorted(routes))
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_requests(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        refs = json.load(f)
    cl = new_cluster(args)
    try:
        cl.start()
        model = json.loads(request(cl, "GET", "/v1/models")[1])["data"][0]["id"]
        before = samples(metrics_text(cl))
        C, CH = "/v1/completions", "/v1/chat/completions"
        reqs = [
            (C, {"prompt": refs[0]["prompt"], "max_tokens": 16, "temperature": 0}),
            (C, {"prompt": refs[1]["prompt"], "max_tokens": 64, "temperature": 0,
                 "stop": ["box"]}),  # the greedy text has "box": finish_reason stop
            (C, {"prompt": refs[2]["prompt"], "max_tokens": 9, "temperature": 0.9, "seed": 3,
                 "ignore_eos": True}),
            (C, {"prompt": refs[3]["prompt"], "max_tokens": 12, "stream": True}),
            (C, {"prompt": refs[4]["prompt"], "max_tokens": 7, "n": 2, "temperature": 0.8,
                 "seed": 1}),
            (CH, {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 20}),
            (CH, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                  "stream": True}),
            (C, {"prompt": [1, 2, 3, 4], "max_tokens": 3}),
        ]
        fins, prompt_sum, gen_sum, usages = [], 0, 0, []
        for path, obj in reqs:
            st, _, fin, usage = completion(cl, path, obj)
            usages.append(usage or {})
            check(st == 200 and fin and usage, "%s %s -> %d %s %s" % (path, list(obj)[:3], st, fin, usage))
            fins.append(fin[0] if fin else None)
            prompt_sum += (usage or {}).get("prompt_tokens", 0)
            gen_sum += (usage or {}).get("completion_tokens", 0)
        # One stream the client abandons: an abort, in no histogram.
        s_ = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
        s_.request("POST", C, body=json.dumps({"prompt": refs[0]["prompt"], "max_tokens": 400,
                                                "ignore_eos": True, "stream": True}).encode(),
                   headers={"Content-Type": "application/json"})
        next(sse_events(s_.getresponse()))
        s_.sock.close()
        s_.close()
        deadline = time.time() + 10
        while True:
            after = samples(metrics_text(cl))
            aborts = value(after, "strata_request_success_total", model_name=model,
                           finished_reason="abort")
            # (stage counters come with each worker's StageStats poll, every
            # 100 ms, each on its own: stage 0's hops do not say that stage
            # 1's answer arrived; wait for every stage figure checked below)
            stages_in = all(value(after, "strata_stage_forward_seconds_count", stage=s_) > 0 and
                            value(after, "strata_stage_load_seconds", stage=s_) > 0 for s_ in ("0", "1"))
            if (aborts >= 1 and value(after, "strata_stage_hops_total", stage="0") > 0 and stages_in) or \
                    time.time() > deadline:
                break
            time.sleep(0.1)
        n = len(reqs)
        print("finish reasons %s, usage: %d prompt + %d generated tokens" % (fins, prompt_sum, gen_sum))

        def d(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        for h in ("strata_e2e_request_latency_seconds", "strata_request_queue_time_seconds",
                  "strata_request_prefill_time_seconds", "strata_request_decode_time_seconds",
                  "strata_request_inference_time_seconds", "strata_request_prompt_tokens",
                  "strata_request_generation_tokens", "strata_request_params_max_tokens",
                  "strata_request_time_per_output_token_seconds"):
            got = d(h + "_count", model_name=model)
            check(got == n, "%s_count grew by %d, the finished requests (got %s)" % (h, n, got))
            inf = d(h + "_bucket", model_name=model, le="+Inf")
            check(inf == n, "%s +Inf bucket grew by %d (got %s)" % (h, n, inf))
        # TTFT is observed at the first token: the abandoned stream had one too.
        got = d("strata_time_to_first_token_seconds_count", model_name=model)
        check(got == n + 1, "strata_time_to_first_token_seconds_count grew by %d (got %s)" % (n + 1, got))
        check(d("strata_request_prompt_tokens_sum", model_name=model) == prompt_sum,
              "strata_request_prompt_tokens_sum grew by the usage prompt_tokens %d (got %s)"
              % (prompt_sum, d("strata_request_prompt_tokens_sum", model_name=model)))
        check(d("strata_request_generation_tokens_sum", model_name=model) == gen_sum,
              "strata_request_generation_tokens_sum grew by the usage completion_tokens %d (got %s)"
              % (gen_sum, d("strata_request_generation_tokens_sum", model_name=model)))
        # The counter also has the abandoned stream's prompt (request 0's prompt).
        want = prompt_sum + usages[0].get("prompt_tokens", 0)
        check(d("strata_prompt_tokens_total", model_name=model) == want,
              "strata_prompt_tokens_total grew by %d (got %s)"
              % (want, d("strata_prompt_tokens_total", model_name=model)))
        g = d("strata_generation_tokens_total", model_name=model)
        check(g >= gen_sum, "strata_generation_tokens_total grew by >= %d (got %s; the abandoned "
              "stream adds its own)" % (gen_sum, g))
        max_sum = sum(o.get("max_tokens", 0) for _, o in reqs)
        check(d("strata_request_params_max_tokens_sum", model_name=model) == max_sum,
              "strata_request_params_max_tokens_sum grew by %d" % max_sum)
        for reason in ("stop", "length"):
            got = d("strata_request_success_total", model_name=model, finished_reason=reason)
            check(got == fins.count(reason), "success_total{finished_reason=%s} grew by %d (got %s)"
                  % (reason, fins.count(reason), got))
        check(fins.count("stop") >= 1 and fins.count("length") >= 1, "both reasons occurred: %s" % fins)
        check(d("strata_request_success_total", model_name=model, finished_reason="abort") == 1,
              "the abandoned stream counts once as abort")
        # Phases add up: queue + prefill + decode <= e2e, per request sums.
        e2e = d("strata_e2e_request_latency_seconds_sum", model_name=model)
        parts = sum(d(h + "_sum", model_name=model) for h in (
            "strata_request_queue_time_seconds", "strata_request_prefill_time_seconds",
            "strata_request_decode_time_seconds"))
        check(0 < parts <= e2e + 1e-6, "queue + prefill + decode (%.4f s) <= e2e (%.4f s)" % (parts, e2e))
        # Per stage, from the workers' StageStats.
        for st_ in ("0", "1"):
            fc = value(after, "strata_stage_forward_seconds_count", stage=st_)
            fs = value(after, "strata_stage_forward_seconds_sum", stage=st_)
            check(fc > 0 and fs > 0, "stage %s forwards observed: %d, %.4f s" % (st_, fc, fs))
            check(value(after, "strata_stage_load_seconds", stage=st_) > 0,
                  "stage %s load time %s s" % (st_, value(after, "strata_stage_load_seconds", stage=st_)))
        hops0 = value(after, "strata_stage_hops_total", stage="0")
        check(hops0 > 0 and value(after, "strata_stage_hop_seconds_total", stage="0") > 0,
              "stage 0's hand-offs to stage 1 counted (%d) with their time" % hops0)
        check(value(after, "strata_stage_hops_total", stage="1") == 0,
              "the last stage has no next hop (0 hops)")
        check(value(after, "strata_placement_epoch") == 1, "strata_placement_epoch 1")
        kv = value(after, "strata_kv_cache_usage_perc")
        check(0 <= kv <= 1 and ("strata_kv_cache_usage_perc", frozenset()) in after,
              "strata_kv_cache_usage_perc %s in [0, 1]" % kv)
        for g_ in ("strata_num_requests_running", "strata_num_requests_waiting"):
            check((g_, frozenset({("model_name", model)})) in after, "%s{model_name} present" % g_)
        check_process(after, cl.coordinator.pid, "coordinator")
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def check_process(s, pid, what):
    """process_* and strata_build_info of a scrape s, against /proc of pid."""
    with open("/proc/%d/stat" % pid) as f:
        stat = f.read()
    with open("/proc/stat") as f:
        btime = int([l for l in f if l.startswith("btime ")][0].split()[1])
    start = btime + int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    got = value(s, "process_start_time_seconds")
    check(abs(got - start) < 0.02, "%s process_start_time_seconds %.2f == /proc's %.2f" % (what, got, start))
    rss = value(s, "process_resident_memory_bytes")
    check(rss > 1 << 20 and value(s, "process_virtual_memory_bytes") > rss,
          "%s resident %d bytes < virtual %d" % (what, rss, value(s, "process_virtual_memory_bytes")))
    fds = value(s, "process_open_fds")
    check(3 <= fds <= value(s, "process_max_fds"), "%s open fds %d <= max %d"
          % (what, fds, value(s, "process_max_fds")))
    check(value(s, "process_cpu_seconds_total") > 0, "%s cpu seconds > 0" % what)
    bi = [dict(k[1]) for k, v in s.items() if k[0] == "strata_build_info" and v == 1]
    check(len(bi) == 1 and re.match(r"^\d+\.\d+\.\d+", bi[0].get("version", "")) and
          bi[0].get("commit") and bi[0].get("build_type"), "%s strata_build_info %s" % (what, bi))


def mode_worker(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        refs = json.load(f)
    # A non-loopback address needs the explicit opt-in.
    r = subprocess.run([args.worker, "--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"],
                       capture_output=True, timeout=30)
    check(r.returncode == 2 and b"--metrics-insecure" in r.stderr,
          "--metrics-listen 0.0.0.0 without --metrics-insecure -> exit %d %s" % (r.returncode, r.stderr[:300]))
    cl = new_cluster(args, worker_metrics=True)
    try:
        cl.start()
        ports = worker_metrics_ports(cl)
        check(all(ports), "both workers serve /metrics: ports %s" % ports)
        if not all(ports):
            return
        for i, path in enumerate(("/", "/metrics/x")):
            st, _, _ = worker_metrics(ports[0], path)
            check(st == 404, "worker GET %s -> %d" % (path, st))
        st, _, _ = worker_metrics(ports[0], "/metrics", "POST")
        check(st == 405, "worker POST /metrics -> %d" % st)
        befores = []
        for p in ports:
            st, ctype, text = worker_metrics(p)
            check(st == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8",
                  "worker GET /metrics -> %d %s" % (st, ctype))
            check_exposition(text, "worker %d /metrics" % p)
            befores.append(samples(text))
        n_tok = 0
        for k in range(4):
            st, b, fin, usage = completion(cl, "/v1/completions", {
                "prompt": refs[k]["prompt"], "max_tokens": 12, "ignore_eos": True})
            check(st == 200, "completion %d -> %d" % (k, st))
            n_tok += (usage or {}).get("completion_tokens", 0)
        time.sleep(0.3)  # the StageStats poll (100 ms) carries the workers' counters
        coord = samples(metrics_text(cl))
        for i, p in enumerate(ports):
            st, _, text = worker_metrics(p)
            check_exposition(text, "worker %d /metrics" % i)
            a, b0 = samples(text), befores[i]

            def d(name, **labels):
                return value(a, name, **labels) - value(b0, name, **labels)

            stg = str(i)
            fw = d("strata_worker_forward_seconds_count", stage=stg)
            fwd_total = d("strata_worker_forwards_total")
            check(fw > 0 and fw == fwd_total,
                  "worker %d: forward histogram count %d == forwards_total growth %d" % (i, fw, fwd_total))
            check(d("strata_worker_tokens_total") >= n_tok,
                  "worker %d: tokens_total grew by >= %d (prompts + generated)" % (i, n_tok))
            check(0 < d("strata_worker_forward_seconds_sum", stage=stg) <= d("strata_worker_busy_seconds_total") + 1e-3,
                  "worker %d: forward time sum <= busy seconds" % i)
            hops = d("strata_worker_hop_seconds_count", stage=stg)
            if i == 0:
                # A forward whose output could not be sent (the next hop not
                # connected yet: BatchError, retried) has no hop.
                errs = d("strata_worker_batch_errors_total")
                check(hops == fw - errs, "worker 0: one hop per forward that did not fail (%d hops, %d "
                      "forwards, %d batch errors)" % (hops, fw, errs))
                check(value(coord, "strata_stage_hops_total", stage="0") ==
                      value(a, "strata_worker_hop_seconds_count", stage="0"),
                      "the coordinator's strata_stage_hops_total{stage=0} == worker 0's hop count")
            else:
                check(hops == 0, "worker 1 (last stage): no hops")
            check(value(coord, "strata_stage_forward_seconds_count", stage=stg) ==
                  value(a, "strata_worker_forward_seconds_count", stage=stg),
                  "the coordinator's forward count for stage %d == the worker's (%s, %s)"
                  % (i, value(coord, "strata_stage_forward_seconds_count", stage=stg),
                     value(a, "strata_worker_forward_seconds_count", stage=stg)))
            # Bytes are payload bytes: stage 0 gets token ids (no payload) and
            # the last stage sends token frames (no payload).
            for c_ in ("frames_sent", "frames_received", "bytes_sent" if i == 0 else "bytes_received"):
                check(d("strata_worker_%s_total" % c_) > 0, "worker %d: %s grew" % (i, c_))
            check(value(a, "strata_worker_bytes_sent_total") ==
                  value(coord, "strata_stage_activation_bytes_total", stage=stg) or i == 1,
                  "worker %d: bytes_sent matches the coordinator's activation bytes" % i)
            check(value(a, "strata_worker_kv_blocks") == 512, "worker %d: 512 KV blocks" % i)
            info = [dict(k[1]) for k, v in a.items() if k[0] == "strata_worker_stage_info" and v == 1]
            check(len(info) == 1 and info[0]["stage"] == stg and info[0]["epoch"] == "1",
                  "worker %d: stage_info %s" % (i, info))
            check(value(a, "strata_worker_stage_ready", stage=stg) == 1, "worker %d: stage ready" % i)
            for z in ("dropped_frames", "fenced_frames", "bad_frames"):
                check(value(a, "strata_worker_%s_total" % z) == 0, "worker %d: %s 0" % (i, z))
            check_process(a, cl.procs[i][1].pid, "worker %d" % i)
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_promtool(args):
    import shutil
    if not shutil.which("promtool"):
        print("SKIP: promtool not found (Debian package prometheus; scripts/bootstrap installs it)")
        sys.exit(77)
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        ref = json.load(f)[0]
    cl = new_cluster(args, worker_metrics=True)
    try:
        cl.start()
        ports = worker_metrics_ports(cl)
        for k in range(3):
            completion(cl, "/v1/completions", {"prompt": ref["prompt"], "max_tokens": 8,
                                               "stream": k == 1})
        request(cl, "GET", "/health")
        request(cl, "GET", "/nope")
        texts = [("coordinator", metrics_text(cl))]
        texts += [("worker %d" % i, worker_metrics(p)[2]) for i, p in enumerate(ports) if p]
        check(len(texts) == 3, "3 scrapes")
        for what, text in texts:
            r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                               capture_output=True, timeout=60)
            out = (r.stdout + r.stderr).decode(errors="replace").strip()
            check(r.returncode == 0 and not out, "promtool check metrics: %s's /metrics (%d bytes)%s"
                  % (what, len(text), "" if r.returncode == 0 and not out else ": " + out[:600]))
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}


def promql_selectors(expr):
    """(metric, [label names matched], [label names grouped]) for each metric
    in a PromQL expression: identifiers not called as functions, outside
    strings, label matchers and range brackets."""
    out = []
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\[[^\]]*\]", "", e)                         # [5m], [$__rate_interval]
    e = re.sub(r"\$\w+", "", e)                               # $variables left outside brackets
    grouped = []
    for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", e):
        grouped += [x.strip() for x in m.group(1).split(",") if x.strip()]
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", e):
        name, matchers, call = m.group(1), m.group(2), m.group(3)
        if call or name.lower() in PROMQL_WORDS or re.match(r"^\d", name):
            continue
        labels = re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)", matchers or "")
        out.append((name, labels, grouped))
    return out


def mode_grafana(args):
    # The query parser finds what the check below needs (so that it can fail).
    got = promql_selectors('histogram_quantile(0.99, sum by (le, stage) (rate(x_seconds_bucket'
                           '{model_name=~"$m", a!="b"}[$__rate_interval]))) / on (stage) y_total')
    check(got == [("x_seconds_bucket", ["model_name", "a"], ["le", "stage", "stage"]),
                  ("y_total", [], ["le", "stage", "stage"])],
          "the PromQL reader finds metrics, matchers and groupings: %s" % got)
    path = os.path.join(HERE, "..", "..", "deploy", "grafana", "strata.json")
    with open(path) as f:
        dash = json.load(f)
    panels = dash.get("panels", [])
    ids = [p.get("id") for p in panels]
    check(dash.get("title") and dash.get("uid") and isinstance(dash.get("schemaVersion"), int),
          "the dashboard has a title, a uid and a schemaVersion")
    check(len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids),
          "%d panels with unique integer ids" % len(ids))
    check(all({"x", "y", "w", "h"} <= set(p.get("gridPos", {})) and
              p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels),
          "every panel has a grid position inside the 24 columns")
    targets = [(p["title"], t) for p in panels if p.get("type") != "row" for t in p.get("targets", [])]
    check(all(t.get("expr") for _, t in targets) and
          all(p.get("targets") for p in panels if p.get("type") != "row"),
          "every panel has targets, every target a query (%d)" % len(targets))
    var_names = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(dash)))
    builtin = {"__rate_interval", "__range", "__interval"}
    check(used - builtin <= var_names, "every variable used is defined: %s of %s"
          % (sorted(used - builtin), sorted(var_names)))
    # The families (and their label names) a real cluster exports.
    cl = new_cluster(args, worker_metrics=True)
    try:
        cl.start()
        completion(cl, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        texts = [metrics_text(cl)] + [worker_metrics(p)[2] for p in worker_metrics_ports(cl) if p]
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()
    families, labels = {}, {}
    for text in texts:
        for line in text.splitlines():
            m = re.match(r"^# TYPE (\S+) (\S+)$", line)
            if m:
                families[m.group(1)] = m.group(2)
        for (name, ls), _ in samples(text).items():
            labels.setdefault(name, set()).update(k for k, _ in ls)
    names = set()
    for title, t in targets:
        for name, matched, grouped in promql_selectors(t["expr"]):
            fam = name
            for suf in ("_bucket", "_sum", "_count"):
                if name.endswith(suf) and families.get(name[:-len(suf)]) == "histogram":
                    fam = name[:-len(suf)]
            names.add(name)
            ok = fam in families and (fam == name or families[fam] == "histogram")
            check(ok, "panel %r: %s is exported (%s)" % (title, name, families.get(fam, "missing")))
            if ok and name in labels:
                want = (set(matched) | set(grouped)) - {"le", "instance", "job"}
                check(want <= labels[name], "panel %r: %s has the labels %s (it has %s)"
                      % (title, name, sorted(want), sorted(labels[name])))
    print("the dashboard queries %d metrics: %s" % (len(names), " ".join(sorted(names))))
    check(len(names) >= 30, "the dashboard queries >= 30 metrics (%d)" % len(names))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "../shared"))
    args = ap.parse_args()
    modes = {"logs": mode_logs, "routes": mode_routes, "requests": mode_requests,
             "worker": mode_worker, "promtool": mode_promtool, "grafana": mode_grafana}
    if args.mode not in modes:
        ap.error("unknown mode %s" % args.mode)
    modes[args.mode](args)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
