"""kanri.runtime: a level-triggered controller runtime for Python operators."""
