package main

// The administration client (admin.Client): ATOM over HTTPS to the AMQP port, trusted through SSL_CERT_FILE.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

func newAdmin() (*admin.Client, error) {
	return admin.NewClientFromConnectionString(connectionString(), nil)
}

// statusOf is the HTTP status of an admin failure (azcore.ResponseError), 0 for none.
func statusOf(err error) int {
	var responseErr *azcore.ResponseError
	if errors.As(err, &responseErr) {
		return responseErr.StatusCode
	}
	return 0
}

func queueView(properties admin.QueueProperties) result {
	return result{
		"lockDuration": properties.LockDuration, "maxSizeInMegabytes": properties.MaxSizeInMegabytes,
		"requiresDuplicateDetection":          properties.RequiresDuplicateDetection,
		"requiresSession":                     properties.RequiresSession,
		"defaultMessageTimeToLive":            properties.DefaultMessageTimeToLive,
		"deadLetteringOnMessageExpiration":    properties.DeadLetteringOnMessageExpiration,
		"duplicateDetectionHistoryTimeWindow": properties.DuplicateDetectionHistoryTimeWindow,
		"maxDeliveryCount":                    properties.MaxDeliveryCount,
		"enableBatchedOperations":             properties.EnableBatchedOperations,
		"status":                              properties.Status, "autoDeleteOnIdle": properties.AutoDeleteOnIdle,
		"enablePartitioning": properties.EnablePartitioning, "forwardTo": properties.ForwardTo,
		"userMetadata": properties.UserMetadata, "maxMessageSizeInKilobytes": properties.MaxMessageSizeInKilobytes,
	}
}

func listQueueNames(ctx context.Context, client *admin.Client, pageSize int32) ([]string, int, error) {
	pager := client.NewListQueuesPager(&admin.ListQueuesOptions{MaxPageSize: pageSize})
	names, pages := []string{}, 0
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, pages, err
		}
		pages++
		for _, queue := range page.Queues {
			names = append(names, queue.QueueName)
		}
	}
	return names, pages, nil
}

func adminEntities(ctx context.Context, _ string) (result, error) {
	client, err := newAdmin()
	if err != nil {
		return nil, err
	}
	out := result{}
	namespace, err := client.GetNamespaceProperties(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("namespace properties: %s", errorText(err))
	}
	out["namespace"] = result{"name": namespace.Name, "sku": namespace.SKU}

	// queues: create with properties, read them back, update, list in pages, runtime counts, delete
	created, err := client.CreateQueue(ctx, "go-admin-q", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
		LockDuration: ptr("PT45S"), RequiresDuplicateDetection: ptr(true), DuplicateDetectionHistoryTimeWindow: ptr("PT2M"),
		MaxDeliveryCount: ptr(int32(7)), DefaultMessageTimeToLive: ptr("P2D"), UserMetadata: ptr("made by go"),
		DeadLetteringOnMessageExpiration: ptr(true),
	}})
	if err != nil {
		return nil, fmt.Errorf("create queue: %s", errorText(err))
	}
	out["created"] = queueView(created.QueueProperties)
	got, err := client.GetQueue(ctx, "go-admin-q", nil)
	if err != nil {
		return nil, fmt.Errorf("get queue: %s", errorText(err))
	}
	out["got"] = queueView(got.QueueProperties)
	properties := got.QueueProperties
	properties.MaxDeliveryCount = ptr(int32(9))
	properties.LockDuration = ptr("PT1M")
	properties.DuplicateDetectionHistoryTimeWindow = ptr("PT3M")
	properties.UserMetadata = ptr("changed by go")
	if _, err := client.UpdateQueue(ctx, "go-admin-q", properties, nil); err != nil {
		return nil, fmt.Errorf("update queue: %s", errorText(err))
	}
	updated, err := client.GetQueue(ctx, "go-admin-q", nil)
	if err != nil {
		return nil, err
	}
	out["updated"] = queueView(updated.QueueProperties)
	for _, name := range []string{"go-admin-q2", "go-admin-q3"} {
		if _, err := client.CreateQueue(ctx, name, nil); err != nil {
			return nil, fmt.Errorf("create %s: %s", name, errorText(err))
		}
	}
	defaults, err := client.GetQueue(ctx, "go-admin-q2", nil)
	if err != nil {
		return nil, err
	}
	out["defaults"] = queueView(defaults.QueueProperties)
	names, pages, err := listQueueNames(ctx, client, 2)
	if err != nil {
		return nil, fmt.Errorf("list queues: %s", errorText(err))
	}
	out["queues"], out["queuePages"] = names, pages

	messaging, err := newClient()
	if err != nil {
		return nil, err
	}
	defer messaging.Close(ctx)
	if err := send(ctx, messaging, "go-admin-q", plain("counted-1"), plain("counted-2")); err != nil {
		return nil, err
	}
	runtime, err := client.GetQueueRuntimeProperties(ctx, "go-admin-q", nil)
	if err != nil {
		return nil, fmt.Errorf("queue runtime properties: %s", errorText(err))
	}
	out["runtime"] = result{
		"active": runtime.ActiveMessageCount, "total": runtime.TotalMessageCount,
		"deadLetter": runtime.DeadLetterMessageCount, "scheduled": runtime.ScheduledMessageCount,
		"sizeSet": runtime.SizeInBytes > 0, "createdAt": !runtime.CreatedAt.IsZero(),
		"createdRecently": time.Since(runtime.CreatedAt).Abs() < time.Hour,
	}
	runtimes := client.NewListQueuesRuntimePropertiesPager(nil)
	listedRuntime := map[string]int32{}
	for runtimes.More() {
		page, err := runtimes.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list queue runtime properties: %s", errorText(err))
		}
		for _, item := range page.QueueRuntimeProperties {
			listedRuntime[item.QueueName] = item.ActiveMessageCount
		}
	}
	out["listedRuntime"] = listedRuntime["go-admin-q"]

	// topics and subscriptions
	topic, err := client.CreateTopic(ctx, "go-admin-t", &admin.CreateTopicOptions{Properties: &admin.TopicProperties{
		RequiresDuplicateDetection: ptr(true), DuplicateDetectionHistoryTimeWindow: ptr("PT5M"),
		DefaultMessageTimeToLive: ptr("PT1H"), SupportOrdering: ptr(true),
	}})
	if err != nil {
		return nil, fmt.Errorf("create topic: %s", errorText(err))
	}
	out["topic"] = result{
		"requiresDuplicateDetection": topic.RequiresDuplicateDetection, "window": topic.DuplicateDetectionHistoryTimeWindow,
		"ttl": topic.DefaultMessageTimeToLive, "supportOrdering": topic.SupportOrdering,
	}
	topicProperties := topic.TopicProperties
	topicProperties.DuplicateDetectionHistoryTimeWindow = ptr("PT7M")
	if _, err := client.UpdateTopic(ctx, "go-admin-t", topicProperties, nil); err != nil {
		return nil, fmt.Errorf("update topic: %s", errorText(err))
	}
	gotTopic, err := client.GetTopic(ctx, "go-admin-t", nil)
	if err != nil {
		return nil, err
	}
	out["topicWindow"] = gotTopic.DuplicateDetectionHistoryTimeWindow
	subscription, err := client.CreateSubscription(ctx, "go-admin-t", "go-sub", &admin.CreateSubscriptionOptions{
		Properties: &admin.SubscriptionProperties{
			LockDuration: ptr("PT30S"), MaxDeliveryCount: ptr(int32(4)), DeadLetteringOnMessageExpiration: ptr(true),
			UserMetadata: ptr("sub by go"),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create subscription: %s", errorText(err))
	}
	out["subscription"] = result{
		"lockDuration": subscription.LockDuration, "maxDeliveryCount": subscription.MaxDeliveryCount,
		"deadLetteringOnMessageExpiration": subscription.DeadLetteringOnMessageExpiration,
		"userMetadata":                     subscription.UserMetadata,
	}
	subscriptionProperties := subscription.SubscriptionProperties
	subscriptionProperties.MaxDeliveryCount = ptr(int32(6))
	if _, err := client.UpdateSubscription(ctx, "go-admin-t", "go-sub", subscriptionProperties, nil); err != nil {
		return nil, fmt.Errorf("update subscription: %s", errorText(err))
	}
	gotSubscription, err := client.GetSubscription(ctx, "go-admin-t", "go-sub", nil)
	if err != nil {
		return nil, err
	}
	out["subscriptionMaxDeliveryCount"] = gotSubscription.MaxDeliveryCount
	if _, err := client.CreateSubscription(ctx, "go-admin-t", "go-sub2", nil); err != nil {
		return nil, err
	}
	subscriptions := client.NewListSubscriptionsPager("go-admin-t", nil)
	subscriptionNames := []string{}
	for subscriptions.More() {
		page, err := subscriptions.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list subscriptions: %s", errorText(err))
		}
		for _, item := range page.Subscriptions {
			subscriptionNames = append(subscriptionNames, item.SubscriptionName)
		}
	}
	sort.Strings(subscriptionNames)
	out["subscriptions"] = subscriptionNames
	if err := send(ctx, messaging, "go-admin-t", plain("to-subs")); err != nil {
		return nil, err
	}
	topicRuntime, err := client.GetTopicRuntimeProperties(ctx, "go-admin-t", nil)
	if err != nil {
		return nil, fmt.Errorf("topic runtime properties: %s", errorText(err))
	}
	out["topicRuntime"] = result{
		"subscriptionCount": topicRuntime.SubscriptionCount, "sqlFilterCount": topicRuntime.SQLFilterCount,
		"correlationFilterCount": topicRuntime.CorrelationFilterCount,
	}
	subscriptionRuntime, err := client.GetSubscriptionRuntimeProperties(ctx, "go-admin-t", "go-sub", nil)
	if err != nil {
		return nil, fmt.Errorf("subscription runtime properties: %s", errorText(err))
	}
	out["subscriptionActive"] = subscriptionRuntime.ActiveMessageCount
	topics := client.NewListTopicsPager(nil)
	topicNames := []string{}
	for topics.More() {
		page, err := topics.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list topics: %s", errorText(err))
		}
		for _, item := range page.Topics {
			topicNames = append(topicNames, item.TopicName)
		}
	}
	out["topics"] = topicNames

	// deletes; a deleted entity reads back as nil (the SDK turns 404 into a nil response)
	if _, err := client.DeleteSubscription(ctx, "go-admin-t", "go-sub2", nil); err != nil {
		return nil, fmt.Errorf("delete subscription: %s", errorText(err))
	}
	goneSubscription, err := client.GetSubscription(ctx, "go-admin-t", "go-sub2", nil)
	out["deletedSubscriptionNil"], out["deletedSubscriptionError"] = goneSubscription == nil, errorText(err)
	if _, err := client.DeleteTopic(ctx, "go-admin-t", nil); err != nil {
		return nil, fmt.Errorf("delete topic: %s", errorText(err))
	}
	goneTopic, err := client.GetTopic(ctx, "go-admin-t", nil)
	out["deletedTopicNil"], out["deletedTopicError"] = goneTopic == nil, errorText(err)
	for _, name := range []string{"go-admin-q", "go-admin-q2", "go-admin-q3"} {
		if _, err := client.DeleteQueue(ctx, name, nil); err != nil {
			return nil, fmt.Errorf("delete queue %s: %s", name, errorText(err))
		}
	}
	goneQueue, err := client.GetQueue(ctx, "go-admin-q", nil)
	out["deletedQueueNil"], out["deletedQueueError"] = goneQueue == nil, errorText(err)
	names, _, err = listQueueNames(ctx, client, 100)
	if err != nil {
		return nil, err
	}
	out["queuesAfter"] = names
	return out, nil
}

func ruleView(rule admin.RuleProperties) result {
	view := result{"name": rule.Name}
	switch filter := rule.Filter.(type) {
	case *admin.SQLFilter:
		view["filter"] = result{"sql": filter.Expression, "parameters": filter.Parameters}
	case *admin.CorrelationFilter:
		view["filter"] = result{
			"correlationId": filter.CorrelationID, "subject": filter.Subject, "properties": filter.ApplicationProperties,
		}
	case *admin.TrueFilter:
		view["filter"] = "true"
	case *admin.FalseFilter:
		view["filter"] = "false"
	default:
		view["filter"] = fmt.Sprintf("%T", rule.Filter)
	}
	if action, ok := rule.Action.(*admin.SQLAction); ok {
		view["action"] = action.Expression
	}
	return view
}

func adminRules(ctx context.Context, _ string) (result, error) {
	client, err := newAdmin()
	if err != nil {
		return nil, err
	}
	const topic, subscription = "go-rules", "picky"
	out := result{}
	if _, err := client.CreateSubscription(ctx, topic, subscription, nil); err != nil {
		return nil, fmt.Errorf("create subscription: %s", errorText(err))
	}
	if _, err := client.DeleteRule(ctx, topic, subscription, "$Default", nil); err != nil {
		return nil, fmt.Errorf("delete $Default: %s", errorText(err))
	}
	red, err := client.CreateRule(ctx, topic, subscription, &admin.CreateRuleOptions{
		Name:   ptr("red"),
		Filter: &admin.SQLFilter{Expression: "color = @wanted", Parameters: map[string]any{"@wanted": "red"}},
		Action: &admin.SQLAction{Expression: "SET seen = 'yes'"},
	})
	if err != nil {
		return nil, fmt.Errorf("create sql rule: %s", errorText(err))
	}
	out["red"] = ruleView(red.RuleProperties)
	vip, err := client.CreateRule(ctx, topic, subscription, &admin.CreateRuleOptions{
		Name: ptr("vip"),
		Filter: &admin.CorrelationFilter{
			CorrelationID: ptr("vip-1"), ApplicationProperties: map[string]any{"tier": int64(3)},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create correlation rule: %s", errorText(err))
	}
	out["vip"] = ruleView(vip.RuleProperties)
	// a typed correlation value (the Java admin client writes every one as a string; Go keeps the int)
	if _, err := client.CreateRule(ctx, topic, subscription, &admin.CreateRuleOptions{
		Name: ptr("tier3"), Filter: &admin.CorrelationFilter{ApplicationProperties: map[string]any{"tier": int64(3)}},
	}); err != nil {
		return nil, fmt.Errorf("create typed correlation rule: %s", errorText(err))
	}
	got, err := client.GetRule(ctx, topic, subscription, "red", nil)
	if err != nil {
		return nil, fmt.Errorf("get rule: %s", errorText(err))
	}
	out["gotRed"] = ruleView(got.RuleProperties)
	if _, err := client.UpdateRule(ctx, topic, subscription, admin.RuleProperties{
		Name: "vip", Filter: &admin.CorrelationFilter{Subject: ptr("urgent")},
	}); err != nil {
		return nil, fmt.Errorf("update rule: %s", errorText(err))
	}
	rules := client.NewListRulesPager(topic, subscription, nil)
	listed := []result{}
	for rules.More() {
		page, err := rules.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list rules: %s", errorText(err))
		}
		for _, rule := range page.Rules {
			listed = append(listed, ruleView(rule))
		}
	}
	out["rules"] = listed
	_, duplicate := client.CreateRule(ctx, topic, subscription, &admin.CreateRuleOptions{Name: ptr("red")})
	out["duplicateStatus"] = statusOf(duplicate)
	_, badSQL := client.CreateRule(ctx, topic, subscription, &admin.CreateRuleOptions{
		Name: ptr("bad"), Filter: &admin.SQLFilter{Expression: "color = = 'red'"},
	})
	out["badSqlStatus"] = statusOf(badSQL)
	missing, missingErr := client.GetRule(ctx, topic, subscription, "nope", nil)
	out["missingNil"], out["missingError"] = missing == nil, errorText(missingErr)

	// the rules route: red matches the SQL filter (its action sets seen), urgent the updated correlation filter
	messaging, err := newClient()
	if err != nil {
		return nil, err
	}
	defer messaging.Close(ctx)
	if err := send(ctx, messaging, topic,
		&azservicebus.Message{MessageID: ptr("m-red"), ApplicationProperties: map[string]any{"color": "red"}},
		&azservicebus.Message{MessageID: ptr("m-blue"), ApplicationProperties: map[string]any{"color": "blue"}},
		&azservicebus.Message{MessageID: ptr("m-vip"), CorrelationID: ptr("vip-1"), ApplicationProperties: map[string]any{"tier": int64(3)}},
		&azservicebus.Message{MessageID: ptr("m-urgent"), Subject: ptr("urgent")},
		&azservicebus.Message{MessageID: ptr("m-tier-text"), ApplicationProperties: map[string]any{"tier": "3"}},
	); err != nil {
		return nil, err
	}
	receiver, err := messaging.NewReceiverForSubscription(topic, subscription, &azservicebus.ReceiverOptions{
		ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete,
	})
	if err != nil {
		return nil, err
	}
	defer receiver.Close(ctx)
	received, err := receiveFor(ctx, receiver, time.Second, nil)
	if err != nil {
		return nil, err
	}
	routed := [][2]any{}
	for _, message := range received {
		routed = append(routed, [2]any{message.MessageID, message.ApplicationProperties["seen"]})
	}
	out["routed"] = routed
	if _, err := client.DeleteRule(ctx, topic, subscription, "vip", nil); err != nil {
		return nil, fmt.Errorf("delete rule: %s", errorText(err))
	}
	_, deleteAgain := client.DeleteRule(ctx, topic, subscription, "vip", nil)
	out["deleteAgainStatus"] = statusOf(deleteAgain)
	return out, nil
}

// adminErrors: what the admin client's failures look like (azcore.ResponseError with the HTTP status).
func adminErrors(ctx context.Context, _ string) (result, error) {
	client, err := newAdmin()
	if err != nil {
		return nil, err
	}
	out := result{}
	if _, err := client.CreateQueue(ctx, "go-err-q", nil); err != nil {
		return nil, err
	}
	_, exists := client.CreateQueue(ctx, "go-err-q", nil)
	out["exists"] = statusOf(exists)
	_, badWindow := client.CreateQueue(ctx, "go-err-bad", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
		RequiresDuplicateDetection: ptr(true), DuplicateDetectionHistoryTimeWindow: ptr("P30D"),
	}})
	out["badWindow"], out["badWindowText"] = statusOf(badWindow), errorText(badWindow)
	_, missingUpdate := client.UpdateQueue(ctx, "go-err-missing", admin.QueueProperties{}, nil)
	out["updateMissing"] = statusOf(missingUpdate)
	_, missingDelete := client.DeleteQueue(ctx, "go-err-missing", nil)
	out["deleteMissing"] = statusOf(missingDelete)
	missingRuntime, err := client.GetQueueRuntimeProperties(ctx, "go-err-missing", nil)
	out["runtimeMissingNil"], out["runtimeMissingError"] = missingRuntime == nil, errorText(err)
	_, noTopic := client.CreateSubscription(ctx, "go-err-no-topic", "sub", nil)
	out["subscriptionNoTopic"] = statusOf(noTopic)
	if _, err := client.DeleteQueue(ctx, "go-err-q", nil); err != nil {
		return nil, err
	}

	// a key without Manage: the admin client is refused (401)
	listenOnly, err := admin.NewClientFromConnectionString(listenConnectionString(), nil)
	if err != nil {
		return nil, err
	}
	_, refused := listenOnly.CreateQueue(ctx, "go-err-listen", nil)
	out["listenOnlyCreate"] = statusOf(refused)
	pager := listenOnly.NewListQueuesPager(nil)
	_, refusedList := pager.NextPage(ctx)
	out["listenOnlyList"] = statusOf(refusedList)
	return out, nil
}

func listenConnectionString() string {
	if listen := os.Getenv("ONCEBUS_LISTEN_ONLY"); listen != "" {
		return listen
	}
	return connectionString()
}
