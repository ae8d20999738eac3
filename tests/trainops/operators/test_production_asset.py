"""The Asset a model's production pointer publishes, and the event a move adds to it."""

from trainops.operators.production_asset import (
    PRODUCTION_ALIAS,
    emit,
    model_asset,
    model_asset_uri,
    production_extra,
)


class Events:
    """``context["outlet_events"]`` as a task sees it: per outlet, an accessor whose ``add``
    records the event added through an alias."""

    def __init__(self):
        self.added: list[tuple[str, str, dict]] = []

    def __getitem__(self, outlet):
        events = self

        class Accessor:
            def add(self, asset, extra=None):
                events.added.append((outlet.name, asset.uri, extra))

        return Accessor()


def test_a_model_name_is_one_asset_uri_whatever_its_characters():
    assert model_asset_uri("retrain-lm") == "trainops://models/retrain-lm"
    assert model_asset_uri("team a/bert") == "trainops://models/team%20a%2Fbert"
    assert model_asset("demo-lm").name == model_asset("demo-lm").uri == "trainops://models/demo-lm"


def test_a_move_adds_its_event_through_the_alias_and_outside_a_task_nothing():
    events = Events()
    extra = production_extra(
        action="promote",
        model="demo-lm",
        version=2,
        uri="file:///r/models/demo-lm/versions/2",
        previous_version=1,
        by="alice",
    )
    emit(events, "demo-lm", extra)
    assert events.added == [(PRODUCTION_ALIAS, "trainops://models/demo-lm", extra)]
    assert extra == {
        "action": "promote",
        "model": "demo-lm",
        "version": 2,
        "uri": "file:///r/models/demo-lm/versions/2",
        "previous_version": 1,
        "by": "alice",
    }
    emit(None, "demo-lm", extra)  # no task run: no error, no event
