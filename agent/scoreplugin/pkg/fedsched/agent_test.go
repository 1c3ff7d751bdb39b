package fedsched

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// AgentEnv names the JSON spec of a real fedsched agent to run the plugin against (see
// agentSpec); tests/agent/serving/test_scoreplugin_build.py starts the agent's gRPC service
// with mutual TLS, writes the spec and runs this test. Without it the test is skipped.
const AgentEnv = "FEDSCHED_SCOREPLUGIN_AGENT"

// agentSpec: where the agent is, which cluster it serves (the candidate nodes, empty), which
// pods to score in which modes, and the file for the results.
type agentSpec struct {
	Address  string   `json:"address"`
	TLS      *TLSArgs `json:"tls"`
	Deadline string   `json:"deadline"`
	Modes    []string `json:"modes"`
	Nodes    []v1.Node
	Pods     []v1.Pod
	Out      string `json:"out"`
}

// agentResult is one pod's scores in one mode, as kube-scheduler would add them up.
type agentResult struct {
	Mode   string           `json:"mode"`
	Pod    string           `json:"pod"`
	Reason string           `json:"reason"` // "" when the agent answered
	Scores map[string]int64 `json:"scores"`
}

func TestWithTheAgent(t *testing.T) {
	path := os.Getenv(AgentEnv)
	if path == "" {
		t.Skipf("%s is not set: no real agent to score against (the pytest wrapper starts one)", AgentEnv)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec agentSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	deadline, err := time.ParseDuration(spec.Deadline)
	if err != nil {
		t.Fatalf("deadline: %v", err)
	}
	nodes := make([]fwk.NodeInfo, len(spec.Nodes))
	for i := range spec.Nodes {
		ni := framework.NewNodeInfo()
		ni.SetNode(&spec.Nodes[i])
		nodes[i] = ni
	}
	var results []agentResult
	for _, mode := range spec.Modes {
		args, err := DecodeArgs(&Args{Address: spec.Address, TLS: spec.TLS, Mode: mode, Deadline: &metav1.Duration{Duration: deadline}})
		if err != nil {
			t.Fatal(err)
		}
		pl, err := NewWithArgs(context.Background(), args)
		if err != nil {
			t.Fatal(err)
		}
		for i := range spec.Pods {
			pod := &spec.Pods[i]
			cs := framework.NewCycleState()
			pl.PreScore(context.Background(), cs, pod, nodes)
			list := make(fwk.NodeScoreList, len(nodes))
			for k, ni := range nodes {
				s, st := pl.Score(context.Background(), cs, pod, ni)
				if !st.IsSuccess() {
					t.Fatalf("Score: %v", st)
				}
				list[k] = fwk.NodeScore{Name: ni.Node().Name, Score: s}
			}
			pl.NormalizeScore(context.Background(), cs, pod, list)
			s, err := getState(cs)
			if err != nil {
				t.Fatal(err)
			}
			if s.reason != "" {
				t.Errorf("mode %s, pod %s: the fallback scored it (%s)", mode, pod.Name, s.reason)
			}
			r := agentResult{Mode: mode, Pod: pod.Name, Reason: s.reason, Scores: map[string]int64{}}
			for _, ns := range list {
				r.Scores[ns.Name] = ns.Score
			}
			results = append(results, r)
		}
		pl.Close()
	}
	out, err := json.MarshalIndent(results, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spec.Out, out, 0o644); err != nil {
		t.Fatal(err)
	}
}
