package fedsched

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"fedsched.dev/scoreplugin/pkg/decisionpb"
)

const hotReason = "fedsched: cpu utilisation 0.95 > 0.90 threshold"

// refuse answers FilterNodes by refusing the named candidates (the agent's reason for each).
func refuse(refusals map[string]string) func([]string) []*decisionpb.NodeRefusal {
	return func(names []string) []*decisionpb.NodeRefusal {
		var out []*decisionpb.NodeRefusal
		for _, n := range names {
			if r, ok := refusals[n]; ok {
				out = append(out, &decisionpb.NodeRefusal{Node: n, Reason: r})
			}
		}
		return out
	}
}

// filter runs PreFilter and, unless it skipped, Filter on every node, as the framework does:
// PreFilter's status, each node's Filter status (nil: passed), PreFilter's duration.
func filter(t *testing.T, pl *Plugin, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.Status, map[string]*fwk.Status, time.Duration) {
	t.Helper()
	ctx := context.Background()
	cs := framework.NewCycleState()
	start := time.Now()
	res, st := pl.PreFilter(ctx, cs, pod, nodes)
	elapsed := time.Since(start)
	if !res.AllNodes() {
		t.Errorf("PreFilter narrowed the nodes to %v: it must leave that to Filter", res.NodeNames)
	}
	out := map[string]*fwk.Status{}
	if st.IsSkip() {
		return st, out, elapsed
	}
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v (it must never reject the pod)", st)
	}
	for _, ni := range nodes {
		if fs := pl.Filter(ctx, cs, pod, ni); !fs.IsSuccess() {
			out[ni.Node().Name] = fs
		}
	}
	return st, out, elapsed
}

func TestFilter(t *testing.T) {
	off := false
	tests := []struct {
		name    string
		agent   *fakeAgent // nil: no agent at all (the address refuses connections)
		silent  bool       // an address that accepts and never answers
		args    Args       // Address and Insecure are filled in
		refused map[string]string
		skip    bool // PreFilter skips: Filter is not run, every node passes
		calls   int  // FilterNodes calls the agent gets for one pod
	}{{
		name:    "the agent refuses a hot node: Filter refuses it with the agent's reason",
		agent:   &fakeAgent{refused: refuse(map[string]string{"n2": hotReason})},
		refused: map[string]string{"n2": hotReason},
		calls:   1,
	}, {
		name:    "several refusals",
		agent:   &fakeAgent{refused: refuse(map[string]string{"n1": hotReason, "n3": "fedsched: node is cordoned"})},
		refused: map[string]string{"n1": hotReason, "n3": "fedsched: node is cordoned"},
		calls:   1,
	}, {
		name:  "nothing refused: Filter skipped",
		agent: &fakeAgent{refused: refuse(nil)},
		skip:  true,
		calls: 1,
	}, {
		name:  "safetyFilter off: no call, Filter skipped",
		agent: &fakeAgent{refused: refuse(map[string]string{"n2": hotReason})},
		args:  Args{SafetyFilter: &off},
		skip:  true,
	}, {
		name:  "agent down: fails open",
		agent: nil,
		skip:  true,
	}, {
		name:   "a silent agent: fails open within the deadline",
		silent: true,
		args:   Args{Deadline: &metav1.Duration{Duration: 30 * time.Millisecond}},
		skip:   true,
	}, {
		name:  "slower than the deadline: fails open",
		agent: &fakeAgent{delay: 300 * time.Millisecond, refused: refuse(map[string]string{"n2": hotReason})},
		args:  Args{Deadline: &metav1.Duration{Duration: 30 * time.Millisecond}},
		skip:  true,
		calls: 1,
	}, {
		name:  "an agent without FilterNodes (UNIMPLEMENTED): fails open",
		agent: &fakeAgent{},
		skip:  true,
		calls: 1,
	}, {
		name: "a refusal of a node that is not a candidate: the answer is discarded",
		agent: &fakeAgent{refused: func([]string) []*decisionpb.NodeRefusal {
			return []*decisionpb.NodeRefusal{{Node: "n2", Reason: hotReason}, {Node: "elsewhere", Reason: hotReason}}
		}},
		skip:  true,
		calls: 1,
	}, {
		name: "a node refused twice: the answer is discarded",
		agent: &fakeAgent{refused: func([]string) []*decisionpb.NodeRefusal {
			return []*decisionpb.NodeRefusal{{Node: "n2", Reason: hotReason}, {Node: "n2", Reason: hotReason}}
		}},
		skip:  true,
		calls: 1,
	}, {
		name: "a refusal without a reason still refuses",
		agent: &fakeAgent{refused: func([]string) []*decisionpb.NodeRefusal {
			return []*decisionpb.NodeRefusal{{Node: "n2"}}
		}},
		refused: map[string]string{"n2": "fedsched: refused by the agent's safety filter"},
		calls:   1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			args.Insecure = true
			if args.Deadline == nil {
				args.Deadline = &metav1.Duration{Duration: MaxDeadline} // answers in time on a loaded machine
			}
			switch {
			case tt.agent != nil:
				args.Address = serve(t, tt.agent)
			case tt.silent:
				args.Address = silentAddress(t)
			default:
				args.Address = deadAddress(t)
			}
			pl := newPlugin(t, &args)
			if tt.agent != nil {
				waitReady(t, pl)
			}
			st, got, elapsed := filter(t, pl, makePod("p", 1000, 2048, 0, nil), cluster())
			if st.IsSkip() != tt.skip {
				t.Errorf("PreFilter status %v, want skip=%v", st, tt.skip)
			}
			if len(got) != len(tt.refused) {
				t.Errorf("Filter refused %v, want %v", got, tt.refused)
			}
			for node, reason := range tt.refused {
				fs := got[node]
				if fs.Code() != fwk.UnschedulableAndUnresolvable || len(fs.Reasons()) != 1 || fs.Reasons()[0] != reason {
					t.Errorf("Filter(%s) = %v, want UnschedulableAndUnresolvable %q", node, fs, reason)
				}
			}
			if limit := pl.args.Deadline.Duration + 250*time.Millisecond; elapsed > limit {
				t.Errorf("PreFilter took %s, more than the deadline %s (+ slack)", elapsed, pl.args.Deadline.Duration)
			}
			if tt.agent != nil {
				calls := tt.agent.waitCalls(func() int { return tt.agent.filterCalls }, tt.calls, 5*time.Second)
				tt.agent.mu.Lock()
				defer tt.agent.mu.Unlock()
				// A timed-out call cancelled before its body left the client never reaches the handler.
				timedOut := tt.agent.delay > pl.args.Deadline.Duration
				if calls > tt.calls || (calls < tt.calls && !timedOut) {
					t.Errorf("the agent got %d FilterNodes calls, want %d", calls, tt.calls)
				}
				if tt.agent.calls != 0 {
					t.Errorf("PreFilter made %d scoring calls", tt.agent.calls)
				}
			}
		})
	}
}

// Filter without a PreFilter answer (PreFilter not enabled, or another plugin's cycle state)
// passes every node.
func TestFilterWithoutPreFilter(t *testing.T) {
	pl := newPlugin(t, &Args{Address: deadAddress(t), Insecure: true})
	for _, ni := range cluster() {
		if st := pl.Filter(context.Background(), framework.NewCycleState(), makePod("p", 1, 1, 0, nil), ni); !st.IsSuccess() {
			t.Errorf("Filter(%s) without PreFilter = %v, want success", ni.Node().Name, st)
		}
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// The agent sends GOAWAY to a connection without an RPC for its idle timeout: the plugin
// connects again at once, so the next pod finds the connection ready.
func TestReconnectsWhenTheAgentClosesAnIdleConnection(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := &countingListener{Listener: inner}
	srv := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 100 * time.Millisecond}))
	decisionpb.RegisterDecisionServiceServer(srv, &fakeAgent{scores: rankScores})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	pl := newPlugin(t, &Args{Address: lis.Addr().String(), Insecure: true})
	deadline := time.Now().Add(20 * time.Second)
	for lis.accepted.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := lis.accepted.Load(); n < 3 {
		t.Fatalf("%d connections in 20 s with a 100 ms idle timeout: the plugin did not reconnect by itself", n)
	}
	waitReady(t, pl)
	if got := pl.conn.GetState(); got != connectivity.Ready {
		t.Errorf("state %s, want READY", got)
	}
}
