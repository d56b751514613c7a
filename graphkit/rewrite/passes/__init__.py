"""The passes of the rewrite; their order is :data:`graphkit.rewrite.engine.PASSES`.

- ``base.py``: what every pass is given and gives back (``RewriteContext``, ``Pass``,
  ``PassResult``, ``ANALYSES``, ``RewriteReport``).
"""
