package fedsched

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"fedsched.dev/scoreplugin/pkg/decisionpb"
)

// filterMode is the `mode` label of the plugin's metrics for the FilterNodes RPC (PreFilter).
const filterMode = "filter"

const filterStateKey fwk.StateKey = Name + "/prefilter"

// preFilterState is the agent's safety-filter answer for one pod: the refused nodes and why.
type preFilterState struct {
	refused map[string]string
}

// Clone shares the state: it is not changed after PreFilter.
func (s *preFilterState) Clone() fwk.StateData { return s }

// PreFilter asks the agent's safety filter (FilterNodes) once for the pod over every node of the
// snapshot, under the deadline, and keeps the refusals for Filter. It fails open: when the
// safety filter is off, the agent does not answer in time, answers an error or nonsense, or
// refuses nothing, it returns Skip and Filter is not run for the pod (kube-scheduler's own
// filters still are). It never rejects the pod itself.
func (pl *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !pl.args.safetyFilter() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	names := make([]string, 0, len(nodes))
	for _, ni := range nodes {
		if n := ni.Node(); n != nil {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	refused := pl.askFilter(ctx, pod, names)
	if len(refused) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	cs.Write(filterStateKey, &preFilterState{refused: refused})
	return nil, nil
}

// PreFilterExtensions returns nil: the refusals do not depend on the pods on the node in this
// cycle (the agent measured them), so adding or removing one changes nothing.
func (pl *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter refuses a node the agent's safety filter refused in PreFilter, with the agent's reason,
// as UnschedulableAndUnresolvable: preempting pods in this cycle cannot change a measurement.
// Without a PreFilter answer the node passes.
func (pl *Plugin) Filter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, ni fwk.NodeInfo) *fwk.Status {
	node := ni.Node()
	if node == nil {
		return nil
	}
	d, err := cs.Read(filterStateKey)
	if err != nil {
		return nil
	}
	s, ok := d.(*preFilterState)
	if !ok {
		return nil
	}
	if reason, refused := s.refused[node.Name]; refused {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reason)
	}
	return nil
}

// askFilter is one FilterNodes RPC under the deadline: the refused nodes with the agent's
// reasons, or nil (pass every node) when there is no usable answer. Never longer than the
// deadline.
func (pl *Plugin) askFilter(ctx context.Context, pod *v1.Pod, names []string) map[string]string {
	logger := klog.FromContext(ctx)
	podJSON, err := encodePod(pod)
	if err != nil {
		pl.filterFail(logger, pod, reasonEncode, err)
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, pl.args.Deadline.Duration)
	defer cancel()
	start := time.Now()
	resp, err := pl.client.FilterNodes(cctx, &decisionpb.FilterNodesRequest{
		Pod: &decisionpb.FilterNodesRequest_PodJson{PodJson: podJSON}, NodeNames: names,
	})
	var refused map[string]string
	if err == nil {
		refused, err = checkRefusals(resp.GetRefused(), names)
	}
	elapsed := time.Since(start)
	requestDuration.WithLabelValues(filterMode).Observe(elapsed.Seconds())
	if err != nil {
		pl.filterFail(logger, pod, reasonOf(err), err)
		return nil
	}
	requestsTotal.WithLabelValues(filterMode, "ok").Inc()
	if pl.filterFailing.Swap(false) {
		logger.V(2).Info("fedsched agent's safety filter answering again", "address", pl.args.Address)
	}
	logger.V(5).Info("fedsched safety filter answered", "pod", klog.KObj(pod), "nodes", len(names),
		"refused", len(refused), "elapsed", elapsed)
	return refused
}

func (pl *Plugin) filterFail(logger klog.Logger, pod *v1.Pod, reason string, err error) {
	requestsTotal.WithLabelValues(filterMode, reason).Inc()
	if !pl.filterFailing.Swap(true) {
		logger.V(2).Info("fedsched agent's safety filter not answering; every node passes this plugin's Filter until it does",
			"address", pl.args.Address, "reason", reason, "err", err.Error())
	}
	logger.V(4).Info("fedsched safety filter skipped", "pod", klog.KObj(pod), "reason", reason, "err", err.Error())
}

// checkRefusals holds the agent to FilterNodes' contract: each refused node is a candidate, named
// once. Anything else discards the whole answer (the plugin then refuses nothing).
func checkRefusals(got []*decisionpb.NodeRefusal, names []string) (map[string]string, error) {
	if len(got) == 0 {
		return nil, nil
	}
	if len(got) > len(names) {
		return nil, &badResponse{fmt.Errorf("%d refusals for %d nodes", len(got), len(names))}
	}
	candidates := make(map[string]struct{}, len(names))
	for _, n := range names {
		candidates[n] = struct{}{}
	}
	out := make(map[string]string, len(got))
	for _, r := range got {
		if _, ok := candidates[r.GetNode()]; !ok {
			return nil, &badResponse{fmt.Errorf("node %q refused but not a candidate", r.GetNode())}
		}
		if _, dup := out[r.GetNode()]; dup {
			return nil, &badResponse{fmt.Errorf("node %q refused twice", r.GetNode())}
		}
		reason := r.GetReason()
		if reason == "" {
			reason = "fedsched: refused by the agent's safety filter"
		}
		out[r.GetNode()] = reason
	}
	return out, nil
}
