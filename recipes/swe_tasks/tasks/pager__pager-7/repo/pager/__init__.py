"""Pagination."""

from pager.pages import Paginator

__all__ = ["Paginator"]
