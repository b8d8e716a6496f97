"""Coscheduling: gangs (PodGroups) placed all or nothing (scheduler-plugins' Coscheduling)."""
