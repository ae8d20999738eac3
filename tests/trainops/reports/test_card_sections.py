"""The model card page's sections: evaluation per slice, and the figures and links they share."""

from __future__ import annotations

import copy

from tests.trainops.reports.helpers import page_text, table_with
from tests.trainops.reports.test_card_page import CARD
from trainops.reports.card_sections import evaluation_section, figure, folder_link, training_section, uri_link

SLICES = {
    "source": {
        "docs": {"eval_loss": 1.87, "perplexity": 6.49, "tokens": 5620},
        "forum": {"eval_loss": 1.83, "perplexity": 6.21, "tokens": 7675},
    }
}


def _card(production_slices: dict | None, with_production: bool = True) -> dict:
    card = copy.deepcopy(CARD)
    card["metrics"]["candidate"]["slices"] = SLICES
    if not with_production:
        card["metrics"]["production"] = None
    elif production_slices is not None:
        card["metrics"]["production"]["slices"] = production_slices
    return card


def test_the_eval_loss_per_slice_beside_production():
    html = evaluation_section(_card({"source": {"docs": {"eval_loss": 2.0, "tokens": 5620}}}), lambda u: True)
    assert table_with(html, "Column") == [
        ["Column", "Value", "Eval loss", "Production eval loss", "Tokens"],
        ["source", "docs", "1.87", "2", "5,620"],
        ["source", "forum", "1.83", "-", "7,675"],  # production was not scored on it
    ]
    alone = evaluation_section(_card(None, with_production=False), lambda u: True)
    assert table_with(alone, "Column")[1] == ["source", "docs", "1.87", "5,620"]
    assert "There was no production model." in page_text(alone)


def test_a_card_without_slices_has_no_slice_table_and_odd_slices_do_not_break_it():
    assert "By slice" not in evaluation_section(CARD, lambda u: True)
    card = _card(None)
    card["metrics"]["candidate"]["slices"] = {"source": "not a mapping", "<b>x</b>": {"<i>": None}}
    html = evaluation_section(card, lambda u: True)
    assert table_with(html, "Column")[1:] == [["<b>x</b>", "<i>", "-", "-", "-"]]
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_figures_and_links():
    assert [figure(v) for v in (None, True, 1234567, 0.000123456, 2.5, "x")] == [
        "-",
        "yes",
        "1,234,567",
        "0.0001235",
        "2.5",
        "x",
    ]
    assert uri_link(None, lambda u: True) == '<span class="muted">-</span>'
    assert uri_link("s3://b/r/a.json", lambda u: False) == "<code>s3://b/r/a.json</code>"
    assert (
        uri_link("s3://b/r/a.json", lambda u: True, "a")
        == '<a href="report?uri=s3%3A%2F%2Fb%2Fr%2Fa.json">a</a>'
    )
    # a folder links to its report file only when that file may be shown
    assert folder_link("s3://b/r/run/", "job.json", lambda u: True).endswith(
        '(<a href="report?uri=s3%3A%2F%2Fb%2Fr%2Frun%2Fjob.json">job.json</a>)'
    )
    assert folder_link("s3://b/r/run", "job.json", lambda u: False) == "<code>s3://b/r/run</code>"


def test_the_training_section_says_which_steps_bad_loss_rollbacks_skipped():
    skipped = copy.deepcopy(CARD)
    skipped["training"]["steps_skipped"] = [[11, 15], [31, 31]]
    text = page_text(training_section(skipped, lambda u: True))
    assert "Steps skipped (bad loss) 11-15, 31" in text
    skipped["training"]["steps_skipped"] = []
    assert "Steps skipped (bad loss) none" in page_text(training_section(skipped, lambda u: True))
    assert "Steps skipped (bad loss) -" in page_text(training_section(CARD, lambda u: True))  # an older card


def test_the_training_section_counts_the_restarts_in_place():
    restarted = copy.deepcopy(CARD)
    restarted["training"]["restarts_in_place"] = 2
    assert "Restarts in place 2" in page_text(training_section(restarted, lambda u: True))
    assert "Restarts in place -" in page_text(training_section(CARD, lambda u: True))  # an older card
