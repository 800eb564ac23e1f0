package oncebus.sdk;

import com.azure.core.exception.ResourceExistsException;
import com.azure.core.exception.ResourceNotFoundException;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.models.CorrelationRuleFilter;
import com.azure.messaging.servicebus.administration.models.CreateQueueOptions;
import com.azure.messaging.servicebus.administration.models.CreateRuleOptions;
import com.azure.messaging.servicebus.administration.models.CreateSubscriptionOptions;
import com.azure.messaging.servicebus.administration.models.CreateTopicOptions;
import com.azure.messaging.servicebus.administration.models.NamespaceProperties;
import com.azure.messaging.servicebus.administration.models.QueueProperties;
import com.azure.messaging.servicebus.administration.models.QueueRuntimeProperties;
import com.azure.messaging.servicebus.administration.models.RuleFilter;
import com.azure.messaging.servicebus.administration.models.RuleProperties;
import com.azure.messaging.servicebus.administration.models.SqlRuleAction;
import com.azure.messaging.servicebus.administration.models.SqlRuleFilter;
import com.azure.messaging.servicebus.administration.models.SubscriptionProperties;
import com.azure.messaging.servicebus.administration.models.TopicProperties;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** ServiceBusAdministrationClient over HTTPS: queues, topics, subscriptions and rules, created to deleted. */
final class AdminScenarios {
    private AdminScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) {
        all.put("admin-queues", AdminScenarios::queues);
        all.put("admin-topics", AdminScenarios::topics);
    }

    private static Map<String, Object> queueView(QueueProperties queue) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("name", queue.getName());
        out.put("requiresDuplicateDetection", queue.isDuplicateDetectionRequired());
        out.put("window", String.valueOf(queue.getDuplicateDetectionHistoryTimeWindow()));
        out.put("lockDuration", String.valueOf(queue.getLockDuration()));
        out.put("maxDeliveryCount", queue.getMaxDeliveryCount());
        out.put("requiresSession", queue.isSessionRequired());
        out.put("partitioned", queue.isPartitioningEnabled());
        out.put("status", String.valueOf(queue.getStatus()));
        out.put("userMetadata", queue.getUserMetadata());
        return out;
    }

    private static Map<String, Object> queues(Env env) {
        String name = "java-admin-q";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusAdministrationClient admin = env.admin();
        NamespaceProperties namespace = admin.getNamespaceProperties();
        result.put("namespaceSku", String.valueOf(namespace.getMessagingSku()));
        QueueProperties created = admin.createQueue(name, new CreateQueueOptions()
            .setDuplicateDetectionRequired(true)
            .setDuplicateDetectionHistoryTimeWindow(Duration.ofMinutes(5))
            .setLockDuration(Duration.ofSeconds(45))
            .setMaxDeliveryCount(7)
            .setUserMetadata("made in Java"));
        result.put("created", queueView(created));
        result.put("got", queueView(admin.getQueue(name)));
        result.put("exists", admin.getQueueExists(name));
        try {
            admin.createQueue(name);
            result.put("createAgain", "accepted");
        } catch (ResourceExistsException e) {
            result.put("createAgain", Main.describe(e));
        }

        QueueProperties update = admin.getQueue(name);
        update.setMaxDeliveryCount(9);
        update.setDuplicateDetectionHistoryTimeWindow(Duration.ofMinutes(2));
        update.setLockDuration(Duration.ofSeconds(30));
        result.put("updated", queueView(admin.updateQueue(update)));
        result.put("gotAfterUpdate", queueView(admin.getQueue(name)));

        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(name).buildClient()) {
            sender.sendMessage(MessagingScenarios.text("one").setMessageId("one"));
            sender.sendMessage(MessagingScenarios.text("one again").setMessageId("one"));
            sender.scheduleMessage(MessagingScenarios.text("later"), java.time.OffsetDateTime.now().plusHours(1));
        }
        QueueRuntimeProperties runtime = admin.getQueueRuntimeProperties(name);
        Map<String, Object> counts = new LinkedHashMap<>();
        counts.put("active", runtime.getActiveMessageCount());
        counts.put("scheduled", runtime.getScheduledMessageCount());
        counts.put("deadLetter", runtime.getDeadLetterMessageCount());
        counts.put("total", runtime.getTotalMessageCount());
        result.put("runtime", counts);

        List<String> listed = new ArrayList<>();
        admin.listQueues().forEach(queue -> listed.add(queue.getName()));
        result.put("listed", listed);

        admin.deleteQueue(name);
        result.put("existsAfterDelete", admin.getQueueExists(name));
        try {
            admin.getQueue(name);
            result.put("getAfterDelete", "found");
        } catch (ResourceNotFoundException e) {
            result.put("getAfterDelete", Main.describe(e));
        }
        return result;
    }

    private static ServiceBusMessage withProperty(ServiceBusMessage message, String name, Object value) {
        message.getApplicationProperties().put(name, value);
        return message;
    }

    private static Map<String, Object> ruleView(RuleProperties rule) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("name", rule.getName());
        RuleFilter filter = rule.getFilter();
        if (filter instanceof SqlRuleFilter) {
            out.put("sql", ((SqlRuleFilter) filter).getSqlExpression());
        }
        if (filter instanceof CorrelationRuleFilter) {
            CorrelationRuleFilter correlation = (CorrelationRuleFilter) filter;
            out.put("correlationId", correlation.getCorrelationId());
            out.put("properties", new LinkedHashMap<>(correlation.getProperties()));
        }
        out.put("filterType", filter.getClass().getSimpleName());
        if (rule.getAction() instanceof SqlRuleAction) {
            out.put("action", ((SqlRuleAction) rule.getAction()).getSqlExpression());
        }
        return out;
    }

    private static Map<String, Object> topics(Env env) {
        String topic = "java-admin-t";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusAdministrationClient admin = env.admin();
        TopicProperties created = admin.createTopic(topic, new CreateTopicOptions()
            .setDuplicateDetectionRequired(true)
            .setDuplicateDetectionHistoryTimeWindow(Duration.ofMinutes(3)));
        result.put("topicWindow", String.valueOf(created.getDuplicateDetectionHistoryTimeWindow()));
        TopicProperties topicUpdate = admin.getTopic(topic);
        topicUpdate.setDuplicateDetectionHistoryTimeWindow(Duration.ofMinutes(4));
        result.put("topicWindowUpdated", String.valueOf(admin.updateTopic(topicUpdate)
            .getDuplicateDetectionHistoryTimeWindow()));
        List<String> topics = new ArrayList<>();
        admin.listTopics().forEach(t -> topics.add(t.getName()));
        result.put("topics", topics);

        admin.createSubscription(topic, "plain");
        SubscriptionProperties red = admin.createSubscription(topic, "red",
            new CreateSubscriptionOptions().setMaxDeliveryCount(4).setLockDuration(Duration.ofSeconds(20)));
        result.put("redMaxDeliveryCount", red.getMaxDeliveryCount());
        SubscriptionProperties subscriptionUpdate = admin.getSubscription(topic, "red");
        subscriptionUpdate.setMaxDeliveryCount(6);
        result.put("redMaxDeliveryCountUpdated", admin.updateSubscription(subscriptionUpdate).getMaxDeliveryCount());
        List<String> subscriptions = new ArrayList<>();
        admin.listSubscriptions(topic).forEach(s -> subscriptions.add(s.getSubscriptionName()));
        result.put("subscriptions", subscriptions);

        admin.deleteRule(topic, "red", "$Default");
        admin.createRule(topic, "red-only", "red", new CreateRuleOptions(new SqlRuleFilter("color = 'red'"))
            .setAction(new SqlRuleAction("SET seen = 'yes'")));
        CorrelationRuleFilter vip = new CorrelationRuleFilter("vip-1");
        vip.getProperties().put("tier", 3);
        admin.createRule(topic, "vip", "red", new CreateRuleOptions(vip));  // (topic, rule, subscription)
        result.put("gotRule", ruleView(admin.getRule(topic, "red", "red-only")));
        List<Map<String, Object>> rules = new ArrayList<>();
        admin.listRules(topic, "red").forEach(rule -> rules.add(ruleView(rule)));
        result.put("rules", rules);

        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().topicName(topic).buildClient();
             ServiceBusReceiverClient receiver =
                 builder.receiver().topicName(topic).subscriptionName("red").buildClient()) {
            sender.sendMessage(withProperty(MessagingScenarios.text("red"), "color", "red"));
            sender.sendMessage(withProperty(MessagingScenarios.text("blue"), "color", "blue"));
            sender.sendMessage(withProperty(MessagingScenarios.text("vip-int").setCorrelationId("vip-1"), "tier", 3));
            sender.sendMessage(withProperty(MessagingScenarios.text("vip-text").setCorrelationId("vip-1"), "tier", "3"));
            List<List<Object>> got = new ArrayList<>();
            for (ServiceBusReceivedMessage message : MessagingScenarios.receive(receiver, 3)) {
                got.add(java.util.Arrays.asList(MessagingScenarios.body(message),
                    message.getApplicationProperties().get("seen")));
                receiver.complete(message);
            }
            result.put("received", got);
        }

        RuleProperties ruleUpdate = admin.getRule(topic, "red", "red-only");
        ruleUpdate.setFilter(new SqlRuleFilter("color = 'crimson'"));
        result.put("ruleUpdated", ruleView(admin.updateRule(topic, "red", ruleUpdate)));
        admin.deleteRule(topic, "red", "vip");
        List<String> left = new ArrayList<>();
        admin.listRules(topic, "red").forEach(rule -> left.add(rule.getName()));
        result.put("rulesAfterDelete", left);

        admin.deleteSubscription(topic, "plain");
        result.put("plainExists", admin.getSubscriptionExists(topic, "plain"));
        admin.deleteTopic(topic);
        result.put("topicExists", admin.getTopicExists(topic));
        return result;
    }
}
