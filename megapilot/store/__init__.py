"""Persistent user state: the saved profile (first-run inputs) and, later, the run history."""

from megapilot.store.profile import Profile, load_profile, profile_path, save_profile

__all__ = ["Profile", "load_profile", "profile_path", "save_profile"]
