// Package fedsched is the fedsched Score plugin for kube-scheduler: the Score-plugin path of the
// seed design. In PreScore it asks the fedsched agent of the member cluster, over gRPC with
// mutual TLS (fedsched.decision.v1.DecisionService, common/proto/decision.proto), either for
// the node-scoring policy's scores of the candidate nodes (mode "scores", ScoreNodes) or for the
// TD3 weight policy's weights (mode "weights", GetSchedulingWeights), once per pod, under a
// strict deadline; Score reads the answer from the CycleState. A failed, late or malformed
// answer never fails the pod's cycle: the pod is scored by a static fallback (kube's
// LeastAllocated formula, or neutrally) and the reason is logged at verbosity 4 and counted in
// fedsched_score_plugin_requests_total.
//
// In PreFilter it asks the agent's safety filter (FilterNodes, the extender's filter rule on the
// same agent state: a node above the hard measured-CPU limit never gets the pod) and Filter
// refuses the nodes it refused; without an answer in time every node passes (filter.go). See
// README.md.
package fedsched

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"fedsched.dev/scoreplugin/pkg/decisionpb"
)

// Name is the plugin's name in KubeSchedulerConfiguration profiles.
const Name = "FedschedScore"

const stateKey fwk.StateKey = Name + "/prescore"

// Fallback reasons (the `result` label of fedsched_score_plugin_requests_total, with "ok").
const (
	reasonTimeout            = "timeout"             // the deadline passed
	reasonUnavailable        = "unavailable"         // no connection to the agent
	reasonFailedPrecondition = "failed-precondition" // mode weights, but the agent has no weight policy
	reasonInvalidArgument    = "invalid-argument"    // the agent could not read the pod
	reasonCanceled           = "canceled"            // the scheduling cycle was cancelled
	reasonError              = "error"               // any other gRPC status
	reasonBadResponse        = "bad-response"        // an answer that breaks the service's contract
	reasonEncode             = "encode"              // the pod could not be encoded as JSON
	reasonNoPreScore         = "no-prescore"         // Score ran without PreScore (not enabled)
)

// Plugin is the fedsched Score plugin (PreFilter, Filter, PreScore, Score, NormalizeScore).
type Plugin struct {
	args          *Args
	conn          *grpc.ClientConn
	client        decisionpb.DecisionServiceClient
	failing       atomic.Bool // the last scoring RPC failed: log the transitions at verbosity 2
	filterFailing atomic.Bool // the same for FilterNodes
	unknown       sync.Once   // the first answer with weight terms the plugin does not compute
}

var (
	_ fwk.PreFilterPlugin  = &Plugin{}
	_ fwk.FilterPlugin     = &Plugin{}
	_ fwk.PreScorePlugin   = &Plugin{}
	_ fwk.ScorePlugin      = &Plugin{}
	_ fwk.ScoreExtensions  = &Plugin{}
	_ fwk.SignPlugin       = &Plugin{}
	_ frameworkFactoryType = New
)

type frameworkFactoryType = func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error)

// New is the plugin's factory (frameworkruntime.PluginFactory): register it with
// app.WithPlugin(fedsched.Name, fedsched.New).
func New(ctx context.Context, obj runtime.Object, _ fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	return NewWithArgs(ctx, args)
}

// NewWithArgs builds the plugin from defaulted, validated Args (DecodeArgs).
func NewWithArgs(ctx context.Context, args *Args) (*Plugin, error) {
	conn, err := dial(args)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	registerMetrics()
	go keepConnected(ctx, conn)
	klog.FromContext(ctx).V(2).Info("fedsched score plugin configured", "args", args.String())
	return &Plugin{args: args, conn: conn, client: decisionpb.NewDecisionServiceClient(conn)}, nil
}

// Name returns the plugin's name.
func (pl *Plugin) Name() string { return Name }

// Close closes the connection to the agent (kube-scheduler never closes plugins; tests do).
func (pl *Plugin) Close() error { return pl.conn.Close() }

// preScoreState is one pod's answer from the agent, or why there is none.
type preScoreState struct {
	reason  string           // "" when the agent answered; else the fallback reason
	scores  map[string]int64 // mode scores: node -> 0..100
	weights termWeights      // mode weights
	req     podRequest       // the pod's requests (weights scoring, fallback)
}

// Clone shares the state: it is not changed after PreScore.
func (s *preScoreState) Clone() fwk.StateData { return s }

func (s *preScoreState) answered() bool { return s.reason == "" }

// PreScore asks the agent once for the pod (over the candidate nodes) and stores the answer,
// or the fallback reason, in the CycleState. It always succeeds.
func (pl *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	names := make([]string, 0, len(nodes))
	for _, ni := range nodes {
		if n := ni.Node(); n != nil {
			names = append(names, n.Name)
		}
	}
	s := &preScoreState{req: requestOf(pod)}
	if len(names) > 0 {
		pl.ask(ctx, s, pod, names)
	}
	cs.Write(stateKey, s)
	return nil
}

// ask fills s from one RPC under the deadline; never longer than the deadline, never an error.
func (pl *Plugin) ask(ctx context.Context, s *preScoreState, pod *v1.Pod, names []string) {
	logger := klog.FromContext(ctx)
	mode := pl.args.Mode
	podJSON, err := encodePod(pod)
	if err != nil {
		pl.fail(logger, s, pod, reasonEncode, err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, pl.args.Deadline.Duration)
	defer cancel()
	start := time.Now()
	var detail []any
	switch mode {
	case ModeWeights:
		var resp *decisionpb.GetSchedulingWeightsResponse
		resp, err = pl.client.GetSchedulingWeights(cctx, &decisionpb.GetSchedulingWeightsRequest{
			Pod: &decisionpb.GetSchedulingWeightsRequest_PodJson{PodJson: podJSON}, NodeNames: names,
		})
		if err == nil {
			var unknown []string
			s.weights, unknown, err = parseWeights(resp.GetWeights())
			if err != nil {
				err = &badResponse{err}
			} else if len(unknown) > 0 {
				pl.unknown.Do(func() {
					logger.V(2).Info("fedsched agent sends weight terms this plugin cannot compute from NodeInfo; "+
						"they are ignored and the other weights scaled to sum 1 (mode scores has no such gap)",
						"terms", unknown)
				})
				logger.V(4).Info("weight terms ignored", "pod", klog.KObj(pod), "terms", unknown)
			}
			detail = []any{"modelVersion", resp.GetModelVersion(), "agentFallback", resp.GetFallbackReason()}
		}
	default:
		var resp *decisionpb.ScoreNodesResponse
		resp, err = pl.client.ScoreNodes(cctx, &decisionpb.ScoreNodesRequest{
			Pod: &decisionpb.ScoreNodesRequest_PodJson{PodJson: podJSON}, NodeNames: names,
		})
		if err == nil {
			s.scores, err = checkScores(resp.GetScores(), names)
			detail = []any{"modelVersion", resp.GetModelVersion(), "source", resp.GetSource(),
				"agentFallback", resp.GetFallbackReason()}
		}
	}
	elapsed := time.Since(start)
	requestDuration.WithLabelValues(mode).Observe(elapsed.Seconds())
	if err != nil {
		pl.fail(logger, s, pod, reasonOf(err), err)
		return
	}
	requestsTotal.WithLabelValues(mode, "ok").Inc()
	if pl.failing.Swap(false) {
		logger.V(2).Info("fedsched agent answering again", "address", pl.args.Address, "mode", mode)
	}
	logger.V(5).Info("fedsched agent answered", append([]any{"pod", klog.KObj(pod), "mode", mode,
		"nodes", len(names), "elapsed", elapsed}, detail...)...)
}

func (pl *Plugin) fail(logger klog.Logger, s *preScoreState, pod *v1.Pod, reason string, err error) {
	s.reason, s.scores = reason, nil
	requestsTotal.WithLabelValues(pl.args.Mode, reason).Inc()
	if !pl.failing.Swap(true) {
		logger.V(2).Info("fedsched agent not answering; scoring from the fallback until it does",
			"address", pl.args.Address, "mode", pl.args.Mode, "fallback", pl.args.Fallback,
			"reason", reason, "err", err.Error())
	}
	logger.V(4).Info("fedsched score fallback", "pod", klog.KObj(pod), "reason", reason, "err", err.Error())
}

// encodePod is the pod as JSON for the agent's reader (its managedFields left out).
func encodePod(pod *v1.Pod) ([]byte, error) {
	p := *pod // shallow: only the copy's ManagedFields is changed
	p.ManagedFields = nil
	return json.Marshal(&p)
}

type badResponse struct{ err error }

func (b *badResponse) Error() string { return "bad response from the fedsched agent: " + b.err.Error() }
func (b *badResponse) Unwrap() error { return b.err }

// checkScores holds the agent to the service's contract: every candidate exactly once, each
// score in 0..100. Anything else discards the whole answer (scores on two scales must not mix).
func checkScores(got []*decisionpb.NodeScore, names []string) (map[string]int64, error) {
	if len(got) != len(names) {
		return nil, &badResponse{fmt.Errorf("%d scores for %d nodes", len(got), len(names))}
	}
	m := make(map[string]int64, len(got))
	for _, ns := range got {
		if ns.GetScore() < fwk.MinNodeScore || ns.GetScore() > fwk.MaxNodeScore {
			return nil, &badResponse{fmt.Errorf("node %q: score %d outside %d..%d",
				ns.GetNode(), ns.GetScore(), fwk.MinNodeScore, fwk.MaxNodeScore)}
		}
		if _, dup := m[ns.GetNode()]; dup {
			return nil, &badResponse{fmt.Errorf("node %q scored twice", ns.GetNode())}
		}
		m[ns.GetNode()] = ns.GetScore()
	}
	for _, n := range names {
		if _, ok := m[n]; !ok {
			return nil, &badResponse{fmt.Errorf("no score for node %q", n)}
		}
	}
	return m, nil
}

func reasonOf(err error) string {
	var bad *badResponse
	if errors.As(err, &bad) {
		return reasonBadResponse
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return reasonTimeout
	case codes.Unavailable:
		return reasonUnavailable
	case codes.FailedPrecondition:
		return reasonFailedPrecondition
	case codes.InvalidArgument:
		return reasonInvalidArgument
	case codes.Canceled:
		return reasonCanceled
	}
	return reasonError
}

func getState(cs fwk.CycleState) (*preScoreState, error) {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil, err
	}
	s, ok := d.(*preScoreState)
	if !ok {
		return nil, fmt.Errorf("%s: CycleState %q holds %T", Name, stateKey, d)
	}
	return s, nil
}

// Score is the node's score from the agent's answer: the policy's score (mode scores) or the
// weighted mean of the node's free/load shares (mode weights); the fallback when there was no
// answer. It never fails.
func (pl *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	node := ni.Node()
	if node == nil {
		return 0, nil
	}
	s, err := getState(cs)
	if err != nil {
		s = &preScoreState{reason: reasonNoPreScore, req: requestOf(pod)}
	}
	if s.answered() {
		if pl.args.Mode == ModeWeights {
			return weightedScore(s.weights, freeShares(ni, s.req)), nil
		}
		return s.scores[node.Name], nil
	}
	return pl.fallbackScore(ni, s.req), nil
}

func (pl *Plugin) fallbackScore(ni fwk.NodeInfo, r podRequest) int64 {
	if pl.args.Fallback == FallbackNeutral {
		return 0
	}
	return leastAllocatedScore(ni, r)
}

// ScoreExtensions returns the plugin itself (NormalizeScore).
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions { return pl }

// NormalizeScore brings the scores into [0, 100]: the policy's scores are stretched to the
// full range with Normalization "MinMax" (best 100, worst 0) and only clamped with "None";
// fallback scores are only clamped.
func (pl *Plugin) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	s, err := getState(cs)
	stretch := err == nil && s.answered() && pl.args.Normalization == NormalizeMinMax
	normalize(scores, stretch)
	return nil
}

func normalize(scores fwk.NodeScoreList, stretch bool) {
	if stretch && len(scores) > 0 {
		lo, hi := scores[0].Score, scores[0].Score
		for _, s := range scores[1:] {
			lo, hi = min(lo, s.Score), max(hi, s.Score)
		}
		if hi > lo {
			span := float64(hi - lo)
			for i := range scores {
				scores[i].Score = int64(math.Round(float64(scores[i].Score-lo) * float64(fwk.MaxNodeScore) / span))
			}
		}
	}
	for i := range scores {
		scores[i].Score = clamp(scores[i].Score)
	}
}

// SignPod refuses to sign pods: the agent's answer depends on the live cluster state and the
// policy, so a cached result of another pod with the same signature must not be reused
// (opportunistic batching, KEP-5598, stays off for this profile's pods).
func (pl *Plugin) SignPod(context.Context, *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return nil, fwk.NewStatus(fwk.Unschedulable, "fedsched scores depend on the agent's live policy and cluster state")
}
