"""Pattern rules and graph passes: what ``--rules`` files and the fusion library are written in.

- ruleset.py: Rule, RuleSet, GraphPass, MatchContext: what a rule is;
- apply.py: apply_rule_set: match, check, replace in every scope, round after round;
- pattern.py: the pattern language; matcher.py and roots.py: matching it;
- template.py and stamps.py: a replacement traced once and stamped on every match;
- graphsurgeon.py: rules over onnx-graphsurgeon objects; loader.py: loading a rules file;
- report.py: what applying rules reports.
"""
