"""JobSpec -> the Kubernetes manifests that would be submitted, in submission order."""

from __future__ import annotations

from trainops.cluster.kubernetes import kinds


def render_manifests(spec) -> list[dict]:
    """The manifests for ``spec`` (plain dicts), in the order to create them: Service and
    PodGroup before the Job, so the pods find them. Raises JobSpecError naming a bad value."""
    return kinds.BUILDERS[spec.kind](spec)


def to_yaml(manifests: list[dict]) -> str:
    """Multi-document YAML, keys in the order they were built."""
    import yaml

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data):  # readable output even if a dict is shared
            return True

    return yaml.dump_all(manifests, Dumper=_NoAliases, sort_keys=False, default_flow_style=False)
