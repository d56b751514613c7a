"""The passes of the rewrite, one module per kind; their order is
:data:`graphkit.rewrite.engine.PASSES`.

- ``base.py``: what every pass is given and gives back (``PassContext``, ``Pass``,
  ``PassResult``, ``ANALYSES``, ``RewriteReport``);
- ``convert.py``: recognise-standard-ops and convert-opset (``--target-opset``);
- ``rules.py``: rules (pattern rules, graph passes) and graphsurgeon-rules;
- ``lower.py``: lower (placeholders replaced by their lowerings);
- ``functions.py``: attach-functions (``--as-functions``);
- ``simplify.py``: simplify (the passes of the SimplifyOptions it is handed, after lowering);
- ``finish.py``: fix-imports and check, run only when a pass changed the model.
"""
