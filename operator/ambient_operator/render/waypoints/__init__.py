"""Waypoints: every decision about a Gateway of our class, its GatewayClass and
istiod's istio-waypoint class defaults. Pure: no API calls, no clock.

Modules, each one concern, in the order a Gateway is judged:

- `names`: which classes are ours, what a Gateway's objects are called, and
  what it serves (`istio.io/waypoint-for`);
- `listeners`: which listeners a waypoint can serve, and its Service's ports;
- `parameters`: reading the `parametersRef` ConfigMaps, never echoing them;
- `policy`: what `spec.waypoints.policy` refuses;
- `settings`: the effective settings, autoscaler and budget after every layer;
- `objects`: the objects themselves, from those decisions;
- `verdicts`: the Gateway's and the class's `Accepted`, and what to deploy;
- `class_defaults`: the Linux pin in istiod's istio-waypoint class defaults.
"""
