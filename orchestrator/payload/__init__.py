"""The payload from the controller's side: build the bundle (:mod:`.bundle`), put it on a host
(:mod:`.deploy`), and speak its JSON-lines protocol (:mod:`.client`)."""
