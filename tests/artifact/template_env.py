"""Read ``template.yaml`` as CloudFormation would for one set of parameters: evaluate the intrinsic
functions the template uses (Ref, GetAtt, If, Sub, FindInMap with a default, Select, Split, the condition
functions) against a map of physical resource values, so tests can run each function with exactly the
environment the template gives it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
NO_VALUE = object()


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    return cfn_yaml.load(str(path))  # type: ignore[no-any-return]


@dataclass
class Evaluator:
    """Evaluates template expressions. ``resources`` maps a logical id (``Ref``) or ``Id.Attribute``
    (``GetAtt``) to its physical value; ``parameters`` override the template's defaults."""

    template: dict[str, Any]
    resources: Mapping[str, str] = field(default_factory=dict)
    parameters: Mapping[str, str] = field(default_factory=dict)
    region: str = "us-east-1"
    account: str = "123456789012"

    def parameter(self, name: str) -> str:
        if name in self.parameters:
            return str(self.parameters[name])
        declared = self.template["Parameters"][name]
        if "Default" not in declared:
            raise KeyError(f"parameter {name} has no default and was not given")
        return str(declared["Default"])

    def ref(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": "aws",
            "AWS::StackName": "stepagent-test",
            "AWS::NoValue": NO_VALUE,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.template.get("Parameters", {}):
            return self.parameter(name)
        return self.physical(name)

    def physical(self, name: str) -> str:
        try:
            return self.resources[name]
        except KeyError:
            raise KeyError(f"no physical value for {name}") from None

    def condition(self, name: str) -> bool:
        return bool(self.value(self.template["Conditions"][name]))

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE}
        ((key, arg),) = node.items()
        if key == "Ref":
            return self.ref(arg)
        if key == "Fn::GetAtt":
            return self.physical(".".join(arg) if isinstance(arg, list) else arg)
        if key == "Fn::If":
            return self.value(arg[1] if self.condition(arg[0]) else arg[2])
        if key == "Condition":
            return self.condition(arg)
        if key == "Fn::Equals":
            return str(self.value(arg[0])) == str(self.value(arg[1]))
        if key == "Fn::Not":
            return not self.value(arg[0])
        if key == "Fn::Or":
            return any(self.value(a) for a in arg)
        if key == "Fn::And":
            return all(self.value(a) for a in arg)
        if key == "Fn::Select":
            return self.value(arg[1])[int(self.value(arg[0]))]
        if key == "Fn::Split":
            return str(self.value(arg[1])).split(arg[0])
        if key == "Fn::FindInMap":
            mapping, top, second = arg[0], self.value(arg[1]), self.value(arg[2])
            options = arg[3] if len(arg) > 3 else {}
            found = self.template["Mappings"][mapping].get(top, {}).get(second)
            if found is None:
                if "DefaultValue" not in options:
                    raise KeyError(f"{mapping}[{top}][{second}] is missing and has no default")
                return options["DefaultValue"]
            return found
        if key == "Fn::Sub":
            text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            names = {k: self.value(v) for k, v in extra.items()}

            def substitute(match: re.Match[str]) -> str:
                name = match.group(1)
                if name in names:
                    return str(names[name])
                return str(self.physical(name) if "." in name else self.ref(name))

            return re.sub(r"\$\{([^}!]+)\}", substitute, text)
        value = self.value(arg)
        return {} if value is NO_VALUE else {key: value}

    def environment(self, function: str) -> dict[str, str]:
        """The environment variables of ``function``: Globals, then the function's own."""
        merged: dict[str, Any] = {}
        globals_env = self.template.get("Globals", {}).get("Function", {}).get("Environment", {})
        merged.update(globals_env.get("Variables", {}))
        own = self.template["Resources"][function]["Properties"].get("Environment", {})
        merged.update(own.get("Variables", {}))
        out: dict[str, str] = {}
        for name, expression in merged.items():
            value = self.value(expression)
            if value is not NO_VALUE:
                out[name] = str(value)
        return out
