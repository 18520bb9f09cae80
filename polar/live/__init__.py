"""The live view of a running fleet: gateways by heartbeat and load, stage occupancy against the limits, the
READY buffer, throughput and failures, weight-version staleness, alarms, and learning curves drawn as SVG.

``view.LiveView`` makes one ``LiveSnapshot``; ``/ui/live`` renders it as HTML (``polar.ui``) and ``polar status``
as text (``text``).
"""

from polar.live.curves import Curves, curve_charts, learning_curves
from polar.live.view import GatewayView, LiveSnapshot, LiveView

__all__ = ["Curves", "GatewayView", "LiveSnapshot", "LiveView", "curve_charts", "learning_curves"]
