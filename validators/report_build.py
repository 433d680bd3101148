"""report.json from a Validation: the contract validators/report_model.py defines (written with
report_model.dumps; validators/report.schema.json is generated from it)."""

from __future__ import annotations

from temper.validators import report_model
from temper.validators.pairs import split
from temper.validators.speedup import Speedup
from temper.validators.subject import CandidateResult, Validation, providers_of
from temper.validators.throughput import Measurement


def build_report(validation: Validation) -> report_model.Report:
    """The report.json contract (validators/report_model.py; written with report_model.dumps)."""
    subject = validation.subject
    throughput = subject.spec.throughput
    provider = providers_of(subject.spec)[0]
    chosen = split(validation.selected, provider)
    return report_model.Report(
        schema_version=report_model.SCHEMA_VERSION,
        recipe=subject.recipe_name,
        host=validation.host,
        target=None if subject.preset is None else report_model.Target.model_validate(subject.preset),
        metric=validation.metric_name,
        baseline=report_model.Baseline(metric=validation.baseline_metric, engine=provider,
                                       throughput=[_measurement(m) for m in validation.baseline_throughput],
                                       batch_composition=validation.baseline_composition),
        allowed_drop=validation.allowed_drop,
        speed_policy=None if throughput is None else report_model.SpeedPolicy(
            min_speedup=throughput.min_speedup, gated_batch_sizes=throughput.gated_sizes,
            confidence=throughput.confidence, max_duration_s=throughput.budget_s,
            inconclusive=throughput.inconclusive),
        candidates={c.verdict.name: _candidate(c, subject.precisions.get(c.pair.model))
                    for c in validation.candidates},
        searches={name: report_model.Search(trials=s.trials, combinations=s.combinations)
                  for name, s in subject.searches.items()},
        session_searches={name: [report_model.SessionSearch.model_validate(r) for r in records]
                          for name, records in validation.session_searches.items()},
        select=subject.rule,
        selected=chosen.model,
        selected_engine=chosen.provider,
        selected_pair=validation.selected,
        selection_reason=validation.reason,
        ties=[report_model.TiedPair(pair=t.name, speedup=None if t.speedup is None else t.speedup.ratio,
                                    speedup_interval=_interval(t.speedup), fidelity=t.fidelity)
              for t in validation.selection.ties],
        engine_disagreements=validation.disagreements,
        passed=validation.passed,
    )


def _interval(up: Speedup | None) -> tuple[float, float] | None:
    return None if up is None or up.low is None or up.high is None else (up.low, up.high)


def _measurement(m: Measurement) -> report_model.Measurement:
    return report_model.Measurement.model_validate(m, from_attributes=True)


def _candidate(c: CandidateResult, precision: str | None) -> report_model.Candidate:
    return report_model.Candidate(
        model=c.pair.model,
        engine=c.pair.provider,
        engine_precision=c.engine_precision,
        passed=c.verdict.passed,
        precision=None if c.census is None else c.census.precision(),
        intended_precision=precision,
        census=None if c.census is None else report_model.Census.model_validate(c.census.as_dict()),
        engine_census=(None if c.engine_census is None
                       else report_model.Census.model_validate(c.engine_census.as_dict())),
        bytes=c.verdict.bytes,
        metric=c.metric,
        drop=c.drop,
        gates=[report_model.Gate.model_validate(g, from_attributes=True) for g in c.verdict.gates],
        fidelity=c.fidelity,
        throughput=[report_model.CandidateMeasurement.model_validate(
            {**m.as_dict(), "speedup": up.ratio,
             "speedup_interval": None if up.low is None or up.high is None else (up.low, up.high)})
            for m, up in c.throughput],
        tuning=None if c.tuning is None else report_model.Tuning.model_validate(c.tuning),
        batch_composition=c.composition,
    )
