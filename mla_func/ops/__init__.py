"""Pure-torch reference math. Static shapes only: no `.item()`, `nonzero`, or data-sized output."""
