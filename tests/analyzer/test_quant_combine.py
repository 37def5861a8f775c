"""The calibrated score's uncertainty and the combined ranking (issue 35): the bootstrap over
calibration examples, the combination with the data-free score by their variances, ties, the
calibration-health numbers, and what the reports make of them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.codec import decode, encode
from fxlens.analyzer.core.report import load_report
from fxlens.analyzer.core.sections import Quant, QuantLayer
from fxlens.analyzer.quant.combine import blend, combine, health, tie_ranks
from fxlens.analyzer.quant.samples import Samples, Spread, bootstrap
from fxlens.analyzer.quant.section import QuantSettings, quant_section, score_of, verdicts
from fxlens.api import AnalysisOptions, analyze_target
from fxlens.rules import load_rules
from fxlens.rules.quant import knowledge, plan_request

MODELS = Path(__file__).parent.parent / "models"
LAYERS = ("a", "b", "c", "d", "e")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models: one thread is fastest, and the suite shares two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _samples(examples: int, seed: int = 0) -> Samples:
    """Five layers at one format whose per-example damage is exponential, means 1…5 × 10⁻³."""
    g = torch.Generator().manual_seed(seed)
    damage = {(name, "int8"): torch.empty(examples, dtype=torch.float64).exponential_(
        generator=g) * (i + 1) * 1e-3 for i, name in enumerate(LAYERS)}
    return Samples(torch.ones(examples, dtype=torch.float64), damage, damage)


def _spread(noise_db: float, examples: int = 64) -> Spread:
    """Point scores 30…34 dB (a worst) with replicates drawn around them, `noise_db` wide."""
    g = torch.Generator().manual_seed(1)
    point = torch.tensor([30.0, 31.0, 32.0, 33.0, 34.0], dtype=torch.float64)
    replicates = point + noise_db * torch.randn(200, 5, generator=g, dtype=torch.float64)
    return Spread(tuple((n, "int8") for n in LAYERS), point, replicates,
                  torch.zeros(5, dtype=torch.float64), examples)


def _calibrated_error(examples: int) -> float:
    spread = bootstrap(_samples(examples))
    assert spread is not None
    scores = {n: {"int8": float(v)} for (n, _), v in zip(spread.pairs, spread.point_db,
                                                          strict=True)}
    combination = combine(scores, {}, {}, {}, spread, "int8")
    return sum(combination.calibrated_error_db[n]["int8"] for n in LAYERS) / len(LAYERS)


def test_the_uncertainty_shrinks_with_more_calibration_rows() -> None:
    """The bootstrap over examples: about 1/√n (16 → 256 rows: ~4× narrower)."""
    few, many = _calibrated_error(16), _calibrated_error(256)
    assert few > 2.5 * many > 0, (few, many)


def test_the_point_of_the_bootstrap_is_the_calibrated_estimate() -> None:
    """The ratio the bootstrap resamples is the score itself (the KL rows' plain mean here)."""
    samples = _samples(32)
    spread = bootstrap(samples)
    assert spread is not None
    for pair, value in zip(spread.pairs, spread.point_db.tolist(), strict=True):
        assert value == pytest.approx(-10 * math.log10(float(samples.damage[pair].mean())))
    assert bootstrap(_samples(1)) is None                      # one example: no spread


def test_the_combined_score_follows_the_precision_of_each_input() -> None:
    """Variance → 0: the calibrated score; huge: the data-free one (shifted by the offset
    that lines the two up); in between, the precision-weighted mean."""
    assert blend(30.0, 1e-12, 40.0, 4.0)[0] == pytest.approx(30.0)
    assert blend(30.0, 1e12, 40.0, 4.0)[0] == pytest.approx(40.0)
    score, weight, variance = blend(30.0, 4.0, 40.0, 4.0)
    assert (score, weight, variance) == (pytest.approx(35.0), 0.5, pytest.approx(2.0))
    assert blend(math.inf, 1.0, 40.0, 4.0)[0] == math.inf     # exact stays exact
    assert blend(math.nan, math.nan, 40.0, 4.0)[0] == 40.0     # data-free only


@pytest.mark.parametrize(("noise_db", "order"), [(1e-4, "calibrated"), (30.0, "data-free")])
def test_the_combination_ranks_by_the_input_it_can_trust(noise_db: float, order: str) -> None:
    spread = _spread(noise_db)
    calibrated = {n: {"int8": float(v)} for n, v in zip(LAYERS, spread.point_db, strict=True)}
    # the data-free score orders the layers the other way round, 20 dB off
    free = {n: {"int8": 20.0 + 4 - i + 0.3 * (i % 2)} for i, n in enumerate(LAYERS)}
    combination = combine(calibrated, {}, free, {}, spread, "int8")
    ranked = sorted(LAYERS, key=lambda n: combination.score_db[n]["int8"])
    wanted = sorted(LAYERS, key=lambda n: (calibrated if order == "calibrated" else free)[n]
                    ["int8"])
    assert ranked == wanted
    weights = [combination.weight[n]["int8"] for n in LAYERS]
    assert all(w > 0.99 for w in weights) if order == "calibrated" else max(weights) < 0.2


def test_layers_whose_intervals_overlap_share_a_rank() -> None:
    scores = {"a": 10.0, "b": 11.0, "c": 13.5, "d": 20.0, "e": math.inf, "f": math.inf}
    errors = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 0.5, "e": 0.0, "f": 0.0}
    assert tie_ranks(scores, errors) == {"a": 1, "b": 1, "c": 3, "d": 4, "e": 5, "f": 5}
    # c's interval reaches a's: tied with the group's first layer, so rank 1
    assert tie_ranks({**scores, "c": 12.5}, errors)["c"] == 1
    # no interval known: nothing is tied
    assert tie_ranks(scores, {})["b"] == 2


def test_health_says_how_stable_the_order_is_and_how_many_rows_would_steady_it() -> None:
    steady = health(_spread(1e-6), 1.0, "int8")
    assert steady.rank_stability == pytest.approx(1.0)
    assert steady.worst_kept == 1.0 and steady.examples_for_stable == 64
    noisy = health(_spread(1.0), 1.0, "int8")
    assert noisy.rank_stability is not None and noisy.rank_stability < 0.95
    assert noisy.worst_kept is not None and noisy.worst_kept < 1.0
    assert noisy.examples_for_stable is not None and noisy.examples_for_stable > 64
    # 4× the rows is half the noise: the order it would give is what 4× promised
    k = noisy.examples_for_stable / 64
    halved = health(_spread(1.0 / math.sqrt(k)), 1.0, "int8")
    assert halved.rank_stability is not None and halved.rank_stability >= 0.95
    assert halved.examples_for_stable == 64
    assert health(_spread(1.0), 2.0, "int8").rank_stability < noisy.rank_stability


# --- through the section and the views --------------------------------------------------------


def _trained() -> tuple[nn.Module, torch.Tensor]:
    """A 5-layer MLP fitted in a second to a teacher's classes on Gaussian inputs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    y = (x @ torch.randn(16, 6, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 6))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(8):
        for i in range(0, 768, 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    return model.eval(), x[768:]


@pytest.fixture(scope="module")
def sections() -> dict[int, Quant]:
    """The section calibrated on 4 and on 64 batches of 4 rows, with the auto plan."""
    model, held = _trained()
    graph = capture(model, (held[:1],), load_rules())
    return {batches: quant_section(model, graph, knowledge(), QuantSettings(
        calibration=[(held[4 * i:4 * i + 4],) for i in range(batches)],
        example_inputs=(held[:1],), plan=plan_request("auto", None)))
        for batches in (4, 64)}


def test_the_section_carries_the_uncertainty_and_ranks_by_the_combined_score(
        sections: dict[int, Quant]) -> None:
    few, many = sections[4], sections[64]
    for section, rows in ((few, 16), (many, 256)):
        assert section.calibration is not None and section.calibration.examples == rows
        for row in section.layers:
            assert row.combined_score_db is not None and row.calibrated_error_db is not None
            assert score_of(row) is row.combined_score_db
            assert set(row.rank or {}) == set(section.formats)
    fmt = few.score_format

    def median_error(section: Quant) -> float:
        errors = sorted(r.calibrated_error_db[fmt] for r in section.layers  # type: ignore[index]
                        if r.calibrated_error_db and r.calibrated_error_db.get(fmt) is not None)
        return errors[len(errors) // 2]
    assert median_error(few) > 1.5 * median_error(many)
    assert few.calibration is not None and many.calibration is not None
    assert few.calibration.calibrated_error_db == pytest.approx(median_error(few), abs=1e-3)
    # the plan and the verdicts are sized by the combined score
    for section in (few, many):
        assert section.plan is not None and section.plan.basis == "combined"
        for row in section.layers:
            assert row.verdicts == verdicts(row, knowledge())


def test_the_verdicts_follow_the_combined_score_not_the_calibrated_one() -> None:
    row = QuantLayer(layer="fc", type="Linear", params=100, status="scored", reason=None,
                     stats={}, weight_sqnr_db={}, data_free_sqnr_db={"int8_per_tensor": 10.0},
                     risks=(), risk_details={},
                     calibrated_score_db={"int8_per_tensor": 60.0},
                     combined_score_db={"int8_per_tensor": 12.0})
    assert verdicts(row, knowledge())["int8_per_tensor"] == "keep higher"
    assert verdicts(QuantLayer(**{**row.__dict__, "combined_score_db": None}),
                    knowledge())["int8_per_tensor"] == "ok"


def test_the_json_round_trip_keeps_the_combination(sections: dict[int, Quant]) -> None:
    section = sections[4]
    data = encode(section)
    assert decode(Quant, data) == section
    row = data["layers"][0]
    assert {"combined_score_db", "combined_error_db", "calibrated_error_db",
            "calibrated_weight", "rank"} <= set(row)
    assert {"examples", "ranking", "rank_stability", "worst_kept"} <= set(data["calibration"])
    old = {**data, "calibration": {k: v for k, v in data["calibration"].items() if k in (
        "batches", "source", "activations", "metric", "logit_leaves")},
        "layers": [{k: v for k, v in r.items() if k not in (
            "combined_score_db", "combined_error_db", "calibrated_error_db",
            "calibrated_weight", "rank")} for r in data["layers"]]}
    before = decode(Quant, old)                          # a report from before issue 35
    assert before.layers[0].combined_score_db is None and encode(before) == old
    assert score_of(before.layers[0]) == before.layers[0].calibrated_score_db


def test_a_report_file_round_trips(tmp_path: Path) -> None:
    """`load_report` reads back every new field of a calibrated report's quant section."""
    path = tmp_path / "calibrated_mlp.py"
    path.write_text((MODELS / "mlp.py").read_text() + (
        "\n\ndef calibration():\n    for i in range(3):\n"
        "        yield (torch.randn(8, 32),)\n"))
    report = analyze_target(str(path), AnalysisOptions(calibrate=True, quant_plan="auto"))
    quant = report.require(Quant)
    assert quant.calibration is not None and quant.calibration.examples == 24
    assert all(row.combined_score_db is not None for row in quant.layers)
    (tmp_path / "r.json").write_text(report.to_json())
    assert load_report(tmp_path / "r.json").require(Quant) == quant


def test_the_views_show_the_interval_the_ties_and_the_health(sections: dict[int, Quant]
                                                             ) -> None:
    from fxlens.reports.views.quant import health_line, layer_table, quant_verdicts

    section = sections[4]
    table = layer_table(section, top=10)
    names = [c.name for c in table.columns]
    assert "score" in names and "#" not in names
    shown = [row[names.index("score")].text for row in table.rows]
    assert all("±" in text for text in shown), shown
    ranks = [(r.rank or {})[section.score_format]
             for r in sorted(section.layers, key=lambda r: (
                 r.combined_score_db[section.score_format], r.layer))]  # type: ignore[index]
    marks = [text.endswith(" =") for text in shown]
    assert marks == [i > 0 and ranks[i] == ranks[i - 1] for i in range(len(ranks))]
    assert "tied" in table.caption
    calibration = section.calibration
    assert calibration is not None and calibration.rank_stability is not None
    line = health_line(calibration)
    assert f"{calibration.examples} rows in 4 batches" in line
    assert f"ρ {calibration.rank_stability:.2f}" in line
    if calibration.examples_for_stable is not None and calibration.examples_for_stable > 16:
        assert f"about {calibration.examples_for_stable} rows" in line
    (int4, _plan) = quant_verdicts(section)
    assert "by combined KL" in int4.detail and "→" in int4.detail
    assert f"calibrated {calibration.examples} rows" in int4.detail
