"""The admission webhook: plans engine Pods, refuses Pods that reach for accelerators on their own.

The planning decision itself lives in `inference_policy`; this package is the edge that turns
AdmissionReviews and plan-API bodies into that decision and the decision back into a JSON Patch,
an admission denial or an HTTP answer.
"""
