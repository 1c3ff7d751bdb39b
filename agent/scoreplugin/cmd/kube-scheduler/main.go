// Command kube-scheduler is kube-scheduler v1.37.2 with the fedsched Score plugin registered
// (out of tree, as kubernetes-sigs/scheduler-plugins builds its scheduler). Enable the plugin
// in a profile of the KubeSchedulerConfiguration (--config); see ../../README.md.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // the JSON log format, as upstream's binary
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // the version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"fedsched.dev/scoreplugin/pkg/fedsched"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(fedsched.Name, fedsched.New))
	os.Exit(cli.Run(command))
}
