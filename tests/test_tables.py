"""Report tables: inapplicable cells empty, full ids, confidence intervals shown when the data has them."""

from __future__ import annotations

import pandas as pd

from mtplab.report.provenance import fixed_and_varied, pages_text
from mtplab.report.tables import ci_text, points_html

ROWS = [
    {"point_id": "tiny-k1-oracle0.7-shared-max-select-decode-verify-t32-s0-r0", "status": "ok", "engine": "mtplab",
     "drafter": "oracle", "k": 1, "alpha": 0.7, "policy": "shared-max", "commit": "select", "tokens": 32,
     "speedup": 1.2, "tokens_per_s": 120.0, "lossless": True},
    {"point_id": "tiny-k2-mtp-shared-max-select-decode-verify-t32-s0-r0", "status": "ok", "engine": "mtplab",
     "drafter": "mtp", "k": 2, "alpha": 0.8, "policy": "shared-max", "commit": "select", "tokens": 32,
     "speedup": 1.1, "tokens_per_s": 110.0, "lossless": True},
    {"point_id": "ort-genai-tiny-k2-mtp-sibling-pinned-select-decode-verify-t32-s0-r0", "status": "ok",
     "engine": "ort-genai", "drafter": "mtp", "k": 2, "alpha": 0.8, "policy": "sibling-pinned", "commit": "select",
     "tokens": 32, "speedup": 0.9, "tokens_per_s": 90.0, "lossless": True},
]


def test_cells_that_do_not_apply_are_empty_and_ids_are_whole():
    other = ROWS[0] | {"point_id": "tiny-k1-oracle0.9-shared-max-select-decode-verify-t32-s0-r0", "alpha": 0.9}
    html = points_html(pd.DataFrame([*ROWS, other]))
    assert html.count("<td>0.70</td>") == 1 and html.count("<td>0.80</td>") == 0  # alpha: oracle rows only
    assert "<td class='text'>sibling-pinned</td>" not in html  # the peer row has no mtplab policy
    assert all(r["point_id"] in html for r in ROWS) and "..." not in html
    assert "Download every point as CSV" in html


def test_the_header_lists_what_was_fixed_and_what_varied_over_applicable_cells():
    fixed, varied = fixed_and_varied(pd.DataFrame(ROWS))
    assert fixed["tokens"] == 32 and fixed["alpha"] == 0.7  # the MTP rows' unused alpha is not a second value
    assert varied["engine"] == ["mtplab", "ort-genai"] and "policy" not in varied
    fixed_rounds = pd.DataFrame(ROWS).assign(rounds=3, rounds_target=0.03, rounds_budget=60.0)
    assert "rounds_target" not in fixed_and_varied(fixed_rounds)[0]  # the auto rounds' knobs beside a fixed count
    auto = fixed_rounds.assign(rounds="auto")
    assert fixed_and_varied(auto)[0]["rounds_target"] == 0.03


def test_a_speedup_confidence_interval_gets_its_own_column_when_recorded():
    rows = [r | {"speedup_ci": [r["speedup"] - 0.05, r["speedup"] + 0.05]} for r in ROWS]
    html = points_html(pd.DataFrame(rows))
    assert "speedup CI" in html and "1.15-1.25" in html
    head = html[html.index("<table class='points'>"):html.index("</tr>")]
    assert head.index("speedup CI") < head.index("engine")  # the answer before the parameters that varied
    assert ci_text({"low": 0.9, "high": 1.1}) == "0.90-1.10" and ci_text(None) == ""


def test_the_header_says_which_pages_the_processes_ran_on():
    assert pages_text({"transparent": "madvise", "malloc_hugetlb": "1"}) == \
        "malloc's memory on huge pages (glibc.malloc.hugetlb=1)"
    assert pages_text({"transparent": "madvise", "malloc_hugetlb": None}) == "4 KiB pages"
    assert pages_text({"transparent": "always", "malloc_hugetlb": None}).startswith("huge pages")
    assert pages_text(None) == "pages not recorded"  # a sweep from before mtplab recorded them


def test_the_head_table_puts_the_peer_under_mtplab_and_says_what_each_points_tokens_were_checked_against():
    from mtplab.report.tables import head_table

    base = {"drafter": "mtp", "k": 2, "prompts": "code", "tokens_per_step": 2.0, "draft_acceptance": 0.5,
            "speedup_ci": [0.7, 0.9], "speedup": 0.8, "lossless": True, "efficiency": 0.6, "commit": "select"}
    rows = pd.DataFrame([
        base | {"engine": "ort-genai", "temperature": 0.0, "acceptance_per_position": "[]", "efficiency": float("nan")},
        base | {"engine": "mtplab", "temperature": 0.7, "acceptance_per_position": "[0.5, 0.25]"},
        base | {"engine": "mtplab", "temperature": 0.0, "acceptance_per_position": "[0.75, 0.5]", "lossless": False},
        base | {"engine": "mtplab", "drafter": "oracle", "temperature": 0.0, "acceptance_per_position": "[1, 1]"},
        base | {"engine": "mtplab", "temperature": 0.0, "acceptance_per_position": "[1, 1]", "speedup": float("nan")},
    ])
    table = head_table(rows)
    assert list(table.engine) == ["mtplab", "ort-genai", "mtplab"]  # no oracle row, no row without a speedup
    assert list(table["P(acc >= i), i = 1..k"]) == ["0.75 0.50", "n/a", "0.50 0.25"]
    assert list(table.tokens) == ["DIFFER from greedy", "identical to greedy", "sampled: state and KV follow them"]
    assert list(table.commit) == ["select", "(genai's)", "select"]
    assert list(table.efficiency) == ["0.60", "n/a", "0.60"] and table["speedup [95% CI]"][0] == "0.80 [0.70, 0.90]"
