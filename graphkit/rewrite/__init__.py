"""The rewrite engine: lower custom:: placeholders into standard ops or kernel bindings."""

from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.engine import Lowering, RewriteReport, check_model, rewrite_model

__all__ = ["Builder", "Lowering", "NameGenerator", "RewriteReport", "TypeTable", "check_model",
           "rewrite_model"]
