"""Pods the operator runs itself: one-shot pods and the platform's pod policy."""
