"""Self-contained HTML pages and notebook fragments, one module per command's page.

- page: what every page shares (plotly.js inline once, sections, figures, treemap figures);
- report: inspect's page (also a Report's notebook display);
- compare and diff: several models at one scale;
- cost: memory, flops and plan.

Nothing is imported here, so that displaying a Report loads only the report page and what it needs.
"""
