"""The report wing: running the notebooks and making their pages; it knows a study only through the study
contract (:mod:`fp8lab.study`).

- :mod:`fp8lab.report.run`: executing notebooks with papermill under a profile, recording their summaries.
- :mod:`fp8lab.report.index`: the index page and the key numbers of each study.
- :mod:`fp8lab.report.htmlexport`, :mod:`fp8lab.report.htmlslim`, :mod:`fp8lab.report.readable`,
  :mod:`fp8lab.report.pagecheck`: the reader's HTML, slimmed, tidied and checked.
- :mod:`fp8lab.report.degrade`: what a study runs on a machine without the native FP8 kernel.
- :mod:`fp8lab.report.decision`: the decision table on the index.

Nothing is imported here.
"""
