#!/usr/bin/env python3
"""routing-tables.py — the tables of docs/routing.md, printed as Markdown from the raw results of
scripts/routing-study.sh (eval-<arm>.json from `tessera eval --json`, loss-<arm>.json from
`tessera loss --json`, partition*.json from `tessera partition --json`, calib-<router>.json from
`tessera calibrate --json`), so that every number in the document can be traced to a file.

    scripts/routing-tables.py RUN_DIR [ARM ...]      (default arms: every eval-*.json there)
    scripts/routing-tables.py --judged REJUDGE.json ...
                                  (the every-judge table of `tessera judge --json` results)
    scripts/routing-tables.py --figure REPORT.html TITLE OUT.svg
                                  (one chart of a `tessera eval --report` page as an SVG file)

Standard library only.
"""
import glob
import json
import os
import sys

CLASSES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Boot"]


def load(path):
    """The JSON at path, or None when it is missing or not (yet) complete."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ci(pair):
    return "[%.2f, %.2f]" % tuple(pair) if pair else ""


def eval_table(run, arms):
    print("| arm | entry | FD | 95 % interval | FD − monolith (paired 95 %) | precision | recall "
          "| IS | agree | evals |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        j = load(os.path.join(run, "eval-%s.json" % arm))
        if not j:
            continue
        for e in j["entries"]:
            name = e["policy"]
            if name.startswith("train data"):
                if arm != arms[0]:
                    continue
                name = "train data (floor, n = %d)" % j["n"]
            d = e.get("fd_minus_first")
            dtxt = ""
            if d:
                lo, hi = d["ci95"]
                value = "%+.2f" % d["value"]
                if lo > 0 or hi < 0:  # the paired interval excludes 0: in bold
                    value = "**%s**" % value
                dtxt = "%s [%+.2f, %+.2f]" % (value, lo, hi)
            print("| %s | %s | %.3f | %s | %s | %.3f | %.3f | %.2f | %.3f | %.0f |" % (
                arm, name, e["fd"], ci(e["fd_ci95"]), dtxt, e["precision"], e["recall"],
                e["inception_score"], e["agreement"] if e["agreement"] >= 0 else float("nan"),
                e["evals_per_sample"]))


def loss_table(run, arms):
    rows = []
    for arm in arms:
        j = load(os.path.join(run, "loss-%s.json" % arm))
        if j:
            rows.append((arm, j))
    if not rows:
        return
    K = len(rows[0][1]["clusters"])
    print("| arm | against | " + " | ".join("cluster %d" % k for k in range(K)) + " | mean |")
    print("|---|---|" + "---|" * (K + 1))
    for arm, j in rows:
        models = j["models"]
        for ref, label in (("monolith", "monolith (b64)"), ("monolith3", "monolith (b8)")):
            if ref not in models:
                continue
            r = models.index(ref)
            ratios = [c["loss"][c["cluster"]] / c["loss"][r] for c in j["clusters"]]
            print("| %s | %s | " % (arm, label) + " | ".join("%.3f" % x for x in ratios) +
                  " | %.3f |" % (sum(ratios) / len(ratios)))
    # the monoliths against each other: seed noise
    j = rows[0][1]
    if "monolith2" in j["models"]:
        a, b = j["models"].index("monolith"), j["models"].index("monolith2")
        diffs = [c["loss"][b] / c["loss"][a] for c in j["clusters"]]
        print()
        print("monolith seed 2 / seed 1 per cluster: " + ", ".join("%.3f" % d for d in diffs))


def class_table(run, arm, names):
    j = load(os.path.join(run, "eval-%s.json" % arm))
    if not j:
        return
    print("| entry | " + " | ".join(CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    for e in j["entries"]:
        if e["policy"] in names:
            print("| %s | " % e["policy"] + " | ".join(
                "%.1f" % v if v is not None else "–" for v in e["per_class_fd"]) + " |")


def cluster_table(run, arm, names):
    j = load(os.path.join(run, "eval-%s.json" % arm))
    if not j:
        return
    ref = j.get("cluster_ref_share", [])
    K = len(ref)
    print("| entry | " + " | ".join("c%d share / FD" % k for k in range(K)) + " |")
    print("|---|" + "---|" * K)
    print("| test set | " + " | ".join("%.3f / –" % r for r in ref) + " |")
    for e in j["entries"]:
        if e["policy"] in names:
            print("| %s | " % e["policy"] + " | ".join(
                "%.3f / %s" % (c["share"], "%.1f" % c["fd"] if c["fd"] is not None else "–")
                for c in e["per_cluster"]) + " |")


def concentration(j):
    """Mean over classes of H(cluster | class) in bits, and of max_k p(k | class), from a
    partition's sizes and class mixes."""
    import math
    clusters = j["clusters"]
    C = len(clusters[0]["class_mix"])
    h_sum = top_sum = 0.0
    for c in range(C):
        mass = [k["size"] * k["class_mix"][c] for k in clusters]
        total = sum(mass)
        p = [m / total for m in mass if m > 0]
        h_sum += -sum(x * math.log2(x) for x in p)
        top_sum += max(p)
    return h_sum / C, top_sum / C


def partition_table(run):
    print("| partition | K | strategy | H(cluster \\| class), bits | mean max p(cluster \\| class) "
          "| largest share |")
    print("|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(run, "partition*.json"))):
        j = load(path)
        if not j:
            continue
        h, top = concentration(j)
        largest = max(k["share"] for k in j["clusters"])
        strategy = j.get("strategy") or "kmeans"
        if j.get("hierarchical"):
            strategy += " (hierarchical, %d fine)" % j["hierarchical"]
        print("| %s | %d | %s | %.2f | %.3f | %.3f |" % (
            os.path.basename(path)[:-5], j["experts"], strategy, h, top, largest))


def calib_table(run):
    for path in sorted(glob.glob(os.path.join(run, "calib-*.json"))):
        j = load(path)
        if not j:
            continue
        print("\n%s: one temperature for every t, T = %.3f (fitted on half of %d test images per "
              "bucket, scored on the other half)\n" % (os.path.basename(path)[:-5],
                                                       j["temperature"], j["n"]))
        print("| t | accuracy | NLL | ECE | own T | ECE at own T | ECE at T |")
        print("|---|---|---|---|---|---|---|")
        for b in j["buckets"]:
            print("| [%.1f, %.1f) | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f |" % (
                b["t_lo"], b["t_hi"], b["accuracy"], b["nll"], b["ece"], b["temperature"],
                b["ece_fit"], b["ece_global"]))


def route_table(run, arms):
    print("| arm | entry | entropy (bits), mean over t | at t = 1 | at the last step | top-expert "
          "switches per sample | spread |")
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        j = load(os.path.join(run, "eval-%s.json" % arm))
        if not j:
            continue
        for e in j["entries"]:
            r = e.get("route")
            if not r:
                continue
            h = [x for x in r["entropy_bits"] if x is not None]
            sp = [x for x in r["spread"] if x is not None]
            print("| %s | %s | %.3f | %.3f | %.3f | %.2f | %s |" % (
                arm, e["policy"], sum(h) / len(h), h[0], h[-1], r["switches_per_sample"] or 0.0,
                "%.4f" % (sum(sp) / len(sp)) if sp else "–"))


def verdict(lo, hi):
    """-1 when a paired 95 % interval lies below 0, +1 above, 0 when it spans it (or is absent)."""
    if lo is None or hi is None:
        return 0
    return -1 if hi < 0 else 1 if lo > 0 else 0


def judged_rows(jj, arm):
    """The rows of one multi-judge result (the `judges` object of `tessera eval --json --judges`,
    or `tessera judge --json` whole): every entry after the first against the first."""
    js = jj["judges"]
    short = [x["name"].split()[0] for x in js]
    first = jj["entries"][0]["name"]
    rows = []
    for i, ent in enumerate(jj["entries"][1:], start=1):
        cells, fds, kids = [], [], []
        for x in js:
            sc = x["scores"][i]
            lo, hi = sc["fd_minus_first_ci95"]
            klo, khi = sc["kid_minus_first_ci95"]
            v, kv = verdict(lo, hi), verdict(klo, khi)
            fds.append(v)
            kids.append(kv)
            d = "%+.2f [%+.2f, %+.2f]" % (sc["fd_minus_first"], lo, hi)
            cells.append(("**%s**" % d if v else d) +
                         ("" if kv == v else " (KID %s)" % {-1: "lower", 0: "n.s.", 1: "higher"}[kv]))
        allv = fds + kids
        if all(v == -1 for v in allv):
            every = "**lower: holds**"
        elif all(v == 1 for v in allv):
            every = "**higher: holds**"
        elif all(v == 0 for v in fds):
            every = "no difference in FD"
        else:  # name the judges by their FD's direction
            parts = []
            for d, word in ((-1, "lower"), (1, "higher"), (0, "n.s.")):
                who = [short[k] for k, v in enumerate(fds) if v == d]
                if who:
                    parts.append("%s %s" % (", ".join(who), word))
            kind = "opposite" if -1 in fds and 1 in fds else "not all"
            every = "%s: %s" % (kind, "; ".join(parts))
        rows.append((arm, ent["name"], first, cells, every))
    return [x["name"] for x in js], rows


def print_judged(names, rows):
    print("| arm | entry | against | " + " | ".join("FD − it: %s" % n for n in names) +
          " | every judge |")
    print("|---|---|---|" + "---|" * len(names) + "---|")
    for arm, ent, first, cells, every in rows:
        print("| %s | %s | %s | %s | %s |" % (arm, ent, first, " | ".join(cells), every))


def judges_table(run, arms):
    """Every entry of every eval that scored its samples in several judges (`tessera eval
    --judges`): FD − the run's first entry (paired 95 %) per judge, KID's verdict where it
    differs, and where every judge agrees. A difference counts where its interval excludes 0, in
    FD and in KID."""
    names, rows = None, []
    for arm in arms:
        j = load(os.path.join(run, "eval-%s.json" % arm))
        if not j or not j.get("judges"):
            continue
        names, more = judged_rows(j["judges"], arm)
        rows += more
    if names is None:
        print("(no eval here was scored by several judges)")
        return
    print_judged(names, rows)


def figure(report, title, out):
    """Writes the <svg> of the chart titled `title` in an eval report to out (the report's SVGs
    are self-contained: xmlns, fonts by name, no scripts)."""
    import html
    try:
        text = open(report, encoding="utf-8").read()
    except OSError as e:
        print("routing-tables: %s" % e, file=sys.stderr)
        return 1
    # the report's own escaping (client/report.c put_esc): & < > " ' → entities, ' as &#39;
    key = 'aria-label="%s"' % html.escape(title, quote=True).replace("&#x27;", "&#39;")
    at = text.find(key)
    if at < 0:
        print("routing-tables: no chart titled %r in %s" % (title, report), file=sys.stderr)
        return 1
    start = text.rfind("<svg", 0, at)
    end = text.find("</svg>", at) + len("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n')
        f.write(text[start:end].replace("<svg ", '<svg style="background:#fff" ', 1) + "\n")
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--figure":
        return figure(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) >= 3 and sys.argv[1] == "--judged":
        for path in sys.argv[2:]:
            j = load(path)
            if not j:
                print("routing-tables: cannot read %s" % path, file=sys.stderr)
                return 1
            print_judged(*judged_rows(j, os.path.basename(path)[8:-5]))
        return 0
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    run = sys.argv[1]
    arms = sys.argv[2:] or sorted(os.path.basename(p)[5:-5]
                                  for p in glob.glob(os.path.join(run, "eval-*.json")))
    print("## FD, intervals, precision/recall, IS\n")
    eval_table(run, arms)
    print("\n## Every judge (tessera eval --judges): FD − the first entry, paired 95 %\n")
    judges_table(run, arms)
    print("\n## Partitions: how concentrated each class is\n")
    partition_table(run)
    print("\n## Routers' calibration along t\n")
    calib_table(run)
    print("\n## Routing along t\n")
    route_table(run, arms)
    print("\n## Held-out loss of expert k on cluster k, over the monolith's\n")
    loss_table(run, ["ens-base", "ens-b8", "ens-warm-b8"])
    for arm in arms:
        j = load(os.path.join(run, "eval-%s.json" % arm))
        if not j:
            continue
        names = [e["policy"] for e in j["entries"] if not e["policy"].startswith("train data")]
        print("\n## Per-class FD: %s\n" % arm)
        class_table(run, arm, names)
        print("\n## Per-cluster share and FD: %s\n" % arm)
        cluster_table(run, arm, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
